"""Traces hashed against a model file are checked against its vocabulary (issue 18.3): a trace encoded by
a tokenizer whose ids are not the model's would read other rows, silently."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram import VocabularyError, load_tokenizer, synth
from engram.cli import main
from engram.tokenmap import default_tokenizer_json
from sim.trace.sources import encoded_by_tokenizer
from sim.trace.tokens import check_model_vocabulary

from tests.modelfiles import SCALE, plan, write_header_only


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """``(model, tokenizer.json)``: a model made from the DeepSeek V4 tokenizer with ' the' and ' of' swapped."""
    d = tmp_path_factory.mktemp("shifted")
    with open(default_tokenizer_json(), encoding="utf-8") as f:
        tj = json.load(f)
    v = tj["model"]["vocab"]
    v["Ġthe"], v["Ġof"] = v["Ġof"], v["Ġthe"]
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (path,) = synth.build_model(d / "m.gguf", synth.ModelShape(scale=SCALE, tokenizer_json=d / "tokenizer.json"),
                                synth.Fill(tables="none", projections=False), progress=False)
    return path, d / "tokenizer.json"


def test_which_sources_a_tokenizer_made(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3")
    npy = tmp_path / "ids.npy"
    np.save(npy, np.arange(3))
    assert encoded_by_tokenizer("text:hello") and encoded_by_tokenizer("stdlib:inspect.py")
    assert encoded_by_tokenizer("synth:reuse=0.2")
    assert not encoded_by_tokenizer(f"tokens:{ids}") and not encoded_by_tokenizer(str(npy))


def test_check_model_vocabulary(shifted, tmp_path):
    path, tj = shifted
    with pytest.raises(VocabularyError) as e:
        check_model_vocabulary(path)
    assert e.value.token_id == 270 and (e.value.tokenizer_token, e.value.file_token) == ("Ġthe", "Ġof")
    assert check_model_vocabulary(path, str(tj)) == "vocabulary"
    (plain,) = write_header_only(plan(), tmp_path / "plain.gguf")
    assert check_model_vocabulary(plain) == "vocabulary"


def test_an_iolog_of_text_against_a_model_of_another_vocabulary_is_refused(shifted, tmp_path, capsys):
    path, _ = shifted
    out = tmp_path / "x.iolog"
    rc = main(["sim", "trace", "iolog", "text:the history of the city", "--model", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "token id 270 is 'Ġthe' (' the') in the tokenizer but 'Ġof' (' of') in the file" in err
    assert not out.exists()
    ids = tmp_path / "ids.txt"  # ids given as they are: the user's to vouch for
    ids.write_text(" ".join(map(str, load_tokenizer().encode("the history of the city").ids)))
    assert main(["sim", "trace", "iolog", f"tokens:{ids}", "--model", str(path), "--out", str(out)]) == 0
    assert out.read_text().startswith("fio version 2 iolog")
