"""The vocabulary that made the token map (issue 18.3): a model file carries its vocabulary, and text is
encoded only by a tokenizer whose vocabulary is the file's (or with the file's own).

The shifted vocabulary is real: the DeepSeek V4 tokenizer.json with the ids of `` the`` (270) and `` of``
(294) swapped, written to a temporary folder; a synthetic model is made from it (its vocabulary,
merges and token map), and the bundled tokenizer is then refused for it.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter, TokenType
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import (ArgumentError, EngramModel, FormatError, Hasher, VocabularyError, build_token_map,
                    check_tokenizer, file_tokenizer, load_tokenizer, read_model, repair_model, synth, tokenizer_vocabulary)
from engram.cli import main as cli_main
from engram.gguf import header as gguf_header
from engram.gguf.header import digest_of_strings, load_strings
from engram.gguf.write import ArrayWriter
from engram.tokenmap import default_tokenizer_json
from engram.vocabulary import token_text

from tests.modelfiles import SCALE, clone_patched, plan, write_header_only

TEXT = "the history of the city"
#: The bundled tokenizer's ids of TEXT: 'the', ' history', ' of', ' the', ' city'.
BUNDLED_IDS = [1805, 3980, 294, 270, 4593]
#: The swapped tokenizer's: ' of' and ' the' trade ids.
SWAPPED_IDS = [1805, 3980, 270, 294, 4593]


@pytest.fixture(scope="module")
def swapped(tmp_path_factory):
    """``(folder, tokenizer.json)`` of the DeepSeek V4 tokenizer with the ids of ' the' and ' of' swapped."""
    d = tmp_path_factory.mktemp("swapped")
    src = default_tokenizer_json()
    with open(src, encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    assert (vocab["Ġthe"], vocab["Ġof"]) == (270, 294)
    vocab["Ġthe"], vocab["Ġof"] = 294, 270
    with open(d / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    shutil.copy(src.with_name("tokenizer_config.json"), d / "tokenizer_config.json")
    return d, d / "tokenizer.json"


@pytest.fixture(scope="module")
def shifted_model(swapped, tmp_path_factory):
    """A model made from the swapped tokenizer: its vocabulary, merges and token map, and the rows of TEXT."""
    _, tj = swapped
    d = tmp_path_factory.mktemp("shifted")
    ids = np.array(load_tokenizer(tj).encode(TEXT, add_special_tokens=False).ids)
    (path,) = synth.build_model(d / "shifted.gguf", synth.ModelShape(scale=SCALE, tokenizer_json=tj),
                                synth.Fill(trace=ids, projections=False), progress=False)
    return path


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    (path,) = write_header_only(plan(), d / "plain.gguf")
    return path


def _lookup(capsys, *argv):
    rc = cli_main(["lookup", *map(str, argv), "--no-gates", "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def _rows(doc):
    return np.array([[t["layers"][str(lid)]["row_ids"] for lid in doc["layer_ids"]] for t in doc["tokens"]])


# ====================================================================== the swapped tokenizer itself
def test_the_swapped_tokenizer_gives_the_same_sizes_and_other_ids(swapped):
    _, tj = swapped
    mine, theirs = build_token_map(), build_token_map(tj)
    assert mine.shape == theirs.shape == (129280,)
    assert int(mine.max()) + 1 == int(theirs.max()) + 1 == 99092  # SPEC §3's count, for both
    # ' the' and ' of' are the first of their keys, so the maps agree at 270 and 294 (each takes the
    # compressed id the other had) and first differ where 'the' and 'of' come again: ' The' (455), ...
    differ = np.flatnonzero(mine != theirs)
    assert differ.tolist() == [455, 671, 1805, 2154, 5673, 6010, 6367, 6932, 20852, 23929, 39922, 78225, 99052]
    assert (mine[270], mine[294]) == (theirs[270], theirs[294])
    assert load_tokenizer().encode(TEXT, add_special_tokens=False).ids == BUNDLED_IDS
    assert load_tokenizer(tj).encode(TEXT, add_special_tokens=False).ids == SWAPPED_IDS


def test_a_synthetic_model_carries_the_vocabulary_it_was_made_from(shifted_model, swapped):
    info = read_model(shifted_model)
    tokens = info.strings("tokenizer.ggml.tokens")
    assert len(tokens) == 129280 and (tokens[270], tokens[294], tokens[1805]) == ("Ġof", "Ġthe", "the")
    assert info.strings("tokenizer.ggml.merges")[:3] == ["Ġ t", "Ġ a", "i n"]
    assert np.array_equal(info.token_map, build_token_map(swapped[1]))
    assert info.vocabulary_summary() == {"tokens": 129280, "merges": 127741, "model": "gpt2", "pre": "deepseek-v3",
                                         "digest": tokenizer_vocabulary(swapped[1]).digest}
    kv = info.metadata["tokenizer.ggml.bos_token_id"]
    assert (kv.type, kv.value) == (GGUFValueType.UINT32, 0)


def test_the_vocabulary_is_written_unless_a_toy_token_map_or_false_says_otherwise():
    """Default: the vocabulary goes in with a token map of the tokenizer's length, and stays out with a toy
    layout's map of another length (which vocabulary=True refuses); vocabulary=False always leaves it out."""
    assert "tokenizer.ggml.tokens" in plan().metadata
    assert "tokenizer.ggml.tokens" not in plan(vocabulary=False).metadata
    toy = np.arange(1000)
    assert "tokenizer.ggml.tokens" not in plan(token_map=toy).metadata
    with pytest.raises(ArgumentError, match="token_map has 1000 entries but the vocabulary of tokenizer .* has "
                                            "129280 tokens"):
        plan(token_map=toy, vocabulary=True)


def test_the_bundled_vocabulary(swapped):
    v = tokenizer_vocabulary()
    assert v.size == 129280 and v.tokens[270] == "Ġthe" and v.tokens[0] == "<｜begin▁of▁sentence｜>"
    assert len(v.merges) == 127741 and v.pre == "deepseek-v3"
    counts = {t: int((v.token_types == int(t)).sum()) for t in (TokenType.CONTROL, TokenType.USER_DEFINED)}
    assert counts == {TokenType.CONTROL: 1230, TokenType.USER_DEFINED: 53}  # 1,283 added tokens, 53 not special
    assert v.special_ids == {"bos": 0, "eos": 1, "pad": 1}
    assert tokenizer_vocabulary() is v  # kept per file
    assert v.digest == digest_of_strings(v.tokens) != tokenizer_vocabulary(swapped[1]).digest


# ====================================================================== the check
def test_the_bundled_tokenizer_is_refused_naming_both_sources_and_the_first_id(shifted_model):
    info = read_model(shifted_model)
    with pytest.raises(VocabularyError) as e:
        check_tokenizer(info)
    err = e.value
    assert (err.token_id, err.tokenizer_token, err.file_token) == (270, "Ġthe", "Ġof")
    assert str(default_tokenizer_json()) in err.tokenizer_source and str(shifted_model) in err.file_source
    msg = str(err)
    assert "token id 270 is 'Ġthe' (' the') in the tokenizer but 'Ġof' (' of') in the file" in msg
    assert str(default_tokenizer_json()) in msg and f"{shifted_model} (tokenizer.ggml.tokens)" in msg
    assert "--file-vocabulary" in msg


def test_the_tokenizer_it_was_made_from_passes(shifted_model, swapped, plain_model):
    assert check_tokenizer(read_model(shifted_model), swapped[1]) == "vocabulary"
    assert check_tokenizer(read_model(plain_model)) == "vocabulary"
    assert check_tokenizer(read_model(plain_model), load_tokenizer()) == "vocabulary"  # a loaded tokenizer too


def test_the_check_is_cheap_once_read(plain_model, monkeypatch):
    """The first check reads the token array once (2.3 MB, one read); later checks read nothing."""
    info = read_model(plain_model)
    tokenizer_vocabulary()
    reads = []
    real = gguf_header._pread
    monkeypatch.setattr(gguf_header, "_pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    check_tokenizer(info)
    kv, merges = info.metadata["tokenizer.ggml.tokens"], info.metadata["tokenizer.ggml.merges"]
    assert reads == [kv.data_nbytes, merges.data_nbytes]  # one read of each array, compared by digest
    assert (kv.data_nbytes, merges.data_nbytes) == (2_323_585, 2_399_021)
    reads.clear()
    for _ in range(3):
        check_tokenizer(info)
    assert reads == []


def test_merges_that_differ_are_refused(tmp_path, plain_model):
    """Same vocabulary, two merges in the other order: some text splits into other tokens."""
    with open(default_tokenizer_json(), encoding="utf-8") as f:
        tj = json.load(f)
    m = tj["model"]["merges"]
    m[5], m[6] = m[6], m[5]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(VocabularyError) as e:
        check_tokenizer(read_model(plain_model), tmp_path / "tokenizer.json")
    assert f"merge #5 is {m[5]!r} in the tokenizer but {m[6]!r} in the file" in str(e.value)


def test_a_file_without_vocabulary_is_checked_by_its_token_map(tmp_path, swapped):
    """Files written before the vocabulary was: the token map built from the tokenizer must be the file's."""
    (path,) = write_header_only(plan(token_map=build_token_map(swapped[1]), vocabulary=False), tmp_path / "old.gguf")
    info = read_model(path)
    assert info.strings("tokenizer.ggml.tokens") is None and info.vocabulary_summary() is None
    assert check_tokenizer(info, swapped[1]) == "token map"
    with pytest.raises(VocabularyError) as e:
        check_tokenizer(info)
    mine, theirs = build_token_map(), info.token_map
    assert e.value.token_id == 455 and e.value.tokenizer_token == "ĠThe"
    assert (f"token id 455 ('ĠThe' (' The') in the tokenizer) has compressed id {int(mine[455])} when built from "
            f"the tokenizer but {int(theirs[455])} in the file") in str(e.value)
    assert (int(mine[455]), int(theirs[455])) == (237, 251)
    with pytest.raises(VocabularyError, match="has no tokenizer.ggml.tokens"):
        file_tokenizer(info)


def test_a_vocabulary_of_another_size(tmp_path, plain_model):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                                                              "merges": ["a b"]}}), encoding="utf-8")
    with pytest.raises(VocabularyError) as e:
        check_tokenizer(read_model(plain_model), small)
    assert f"tokenizer {small} has 3 token ids but {plain_model} (tokenizer.ggml.tokens) has 129,280" in str(e.value)
    assert "token id 0 is 'a' in the tokenizer but '<｜begin▁of▁sentence｜>' in the file" in str(e.value)
    assert e.value.token_id == 0


# ====================================================================== engram lookup
def test_lookup_refuses_the_bundled_tokenizer_and_agrees_with_the_right_ones(shifted_model, swapped, capsys):
    rc, _, err = _lookup(capsys, shifted_model, "--text", TEXT)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("engram lookup: error: ") and "token id 270 is 'Ġthe' (' the')" in err
    rc, made, _ = _lookup(capsys, shifted_model, "--text", TEXT, "--tokenizer", swapped[1])
    assert rc == 0 and [t["token"] for t in made["tokens"]] == SWAPPED_IDS
    rc, own, _ = _lookup(capsys, shifted_model, "--text", TEXT, "--file-vocabulary")
    assert rc == 0 and [t["token"] for t in own["tokens"]] == SWAPPED_IDS
    assert np.array_equal(_rows(own), _rows(made))
    # what the check prevents: the bundled ids, hashed with the file's token map, read other rows
    info = read_model(shifted_model)
    wrong = Hasher(info.layout, info.token_map).hash(np.array(BUNDLED_IDS))
    assert np.array_equal(Hasher(info.layout, info.token_map).hash(np.array(SWAPPED_IDS)), _rows(made))
    assert not np.array_equal(wrong, _rows(made)) and np.array_equal(wrong[:2], _rows(made)[:2])
    assert [t["text"] for t in own["tokens"]] == ["the", " history", " of", " the", " city"]


def test_inspect_shows_the_vocabulary(shifted_model, swapped, capsys):
    assert cli_main(["inspect", str(shifted_model)]) == 0
    out = capsys.readouterr().out
    digest = tokenizer_vocabulary(swapped[1]).digest
    assert f"vocabulary    gpt2/deepseek-v3: 129,280 tokens, 127,741 merges, sha256 {digest[:16]}" in out
    assert "token map     129,280 token ids -> 99,092 compressed, pad id 2" in out
    assert cli_main(["inspect", str(shifted_model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vocabulary"]["digest"] == digest


# ====================================================================== the file's own vocabulary
def test_the_files_own_tokenizer_encodes_as_the_one_it_was_made_from(shifted_model, swapped, shared_data):
    info = read_model(shifted_model)
    mine = file_tokenizer(info)
    assert file_tokenizer(info) is mine  # kept by the ModelInfo
    made = load_tokenizer(swapped[1])
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[:20000]
    text += " <｜User｜>Hello<｜Assistant｜> 12345 日本語 ﬁne café\n\tdef f(x):\n        return x<｜end▁of▁sentence｜>"
    got = mine.encode(text, add_special_tokens=False).ids
    assert got == made.encode(text, add_special_tokens=False).ids and len(got) > 4000
    assert mine.decode(got[:50]) == made.decode(got[:50])
    model = EngramModel.open(shifted_model)
    assert model.encode(TEXT, vocabulary="file").tolist() == SWAPPED_IDS
    assert model.encode(TEXT, swapped[1]).tolist() == SWAPPED_IDS
    with pytest.raises(VocabularyError):
        model.encode(TEXT)


def test_a_file_tokenizer_needs_a_known_pre_tokenizer_and_merges(tmp_path):
    p = plan()
    p.metadata["tokenizer.ggml.pre"] = ("qwen2", GGUFValueType.STRING, None)
    (path,) = write_header_only(p, tmp_path / "qwen.gguf")
    with pytest.raises(VocabularyError, match="tokenizer.ggml.pre is 'qwen2', not 'deepseek-v3'"):
        file_tokenizer(read_model(path))
    assert file_tokenizer(read_model(path), default_tokenizer_json()).encode(TEXT).ids == BUNDLED_IDS  # trusted
    p = plan()
    del p.metadata["tokenizer.ggml.merges"]
    (path,) = write_header_only(p, tmp_path / "nomerges.gguf")
    with pytest.raises(VocabularyError, match="has no tokenizer.ggml.merges"):
        file_tokenizer(read_model(path))
    assert check_tokenizer(read_model(path)) == "vocabulary"  # the tokens alone are compared


# ====================================================================== what carries it
def test_repair_and_split_sets_keep_the_vocabulary(shifted_model, swapped, tmp_path):
    (out,) = repair_model(shifted_model, tmp_path / "r.gguf", progress=False)
    a, b = read_model(shifted_model), read_model(out)
    assert b.strings_digest("tokenizer.ggml.tokens") == a.strings_digest("tokenizer.ggml.tokens")
    assert b.strings("tokenizer.ggml.merges") == a.strings("tokenizer.ggml.merges")
    assert check_tokenizer(b, swapped[1]) == "vocabulary"
    paths = synth.build_model(tmp_path / "sp.gguf", synth.ModelShape(scale=SCALE, shards=3, tokenizer_json=swapped[1]),
                              synth.Fill(tables="none", projections=False), progress=False)
    info = read_model(paths[2])
    assert info.strings("tokenizer.ggml.tokens")[270] == "Ġof" and check_tokenizer(info, swapped[1]) == "vocabulary"
    with pytest.raises(VocabularyError):
        check_tokenizer(info)


def test_a_token_that_is_not_utf8_names_its_entry(plain_model, tmp_path):
    info = read_model(plain_model)
    kv = info.metadata["tokenizer.ggml.tokens"]
    at = kv.data_offset + 8  # first byte of token 0

    def patch(h):
        h[at] = 0xFF
    bad = clone_patched(plain_model, tmp_path / "bad.gguf", patch)
    info = read_model(bad)  # parsing only locates the strings
    with pytest.raises(FormatError, match=r"tokenizer.ggml.tokens\[0\]: string is not valid UTF-8 \(byte offset "
                                          rf"{kv.data_offset}\)"):
        load_strings(info.metadata["tokenizer.ggml.tokens"])
    with pytest.raises(FormatError, match="not valid UTF-8"):  # the digests differ; naming the id reads the strings
        check_tokenizer(info)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=40))
def test_strings_are_stored_as_gguf_stores_them(strings):
    """The one-step array packing writes the bytes gguf's writer writes; the digest of strings is that of
    their stored bytes."""
    mine, ref = ArrayWriter("x.gguf", "a"), GGUFWriter("y.gguf", "a")
    for add in (True, False):
        got = mine._pack_val(strings, GGUFValueType.ARRAY, add, GGUFValueType.STRING)
        assert got == ref._pack_val(strings, GGUFValueType.ARRAY, add, GGUFValueType.STRING)
    assert digest_of_strings(strings) == hashlib.sha256(got[12:]).hexdigest()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([GGUFValueType.UINT8, GGUFValueType.INT16, GGUFValueType.UINT32, GGUFValueType.INT32,
                        GGUFValueType.UINT64, GGUFValueType.INT64, GGUFValueType.FLOAT32, GGUFValueType.BOOL]),
       st.lists(st.integers(0, 100), min_size=1, max_size=50))
def test_numeric_arrays_are_stored_as_gguf_stores_them(sub, values):
    vals = [bool(v % 2) for v in values] if sub == GGUFValueType.BOOL else values
    mine, ref = ArrayWriter("x.gguf", "a"), GGUFWriter("y.gguf", "a")
    assert mine._pack_val(vals, GGUFValueType.ARRAY, True, sub) == ref._pack_val(vals, GGUFValueType.ARRAY, True, sub)


def test_token_text():
    assert token_text("Ġthe") == " the" and token_text("ĊĠĠ") == "\n  " and token_text("<｜User｜>") == "<｜User｜>"
