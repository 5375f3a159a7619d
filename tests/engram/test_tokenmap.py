"""Compressed token map from the real DeepSeek V4 tokenizer (SPEC §3)."""

import json

import numpy as np
import pytest

from engram import TokenError, build_token_map


def test_kat_sizes(token_map):
    assert token_map.dtype == np.int32 and token_map.shape == (129_280,)
    assert int(token_map.max()) + 1 == 99_092
    assert len(np.unique(token_map)) == 99_092
    assert token_map[:5].tolist() == [0, 1, 2, 3, 4]


def test_ids_in_order_of_first_appearance(token_map):
    seen = set()
    order = []
    for c in token_map.tolist():
        if c not in seen:
            seen.add(c)
            order.append(c)
    assert order == list(range(99_092))


def test_case_and_space_variants_share_an_id(token_map, tokenizer):
    vocab = tokenizer.get_vocab()
    groups = [("The", "the", "Ġthe", "ĠThe", "THE"), ("Hello", "hello", "Ġhello")]
    for group in groups:
        ids = [vocab[t] for t in group if t in vocab]
        assert len(ids) >= 2
        assert len({int(token_map[i]) for i in ids}) == 1, group


def test_small_tokenizer_json(tmp_path):
    # A tiny WordLevel tokenizer: "A" and "a" normalise alike; "é" loses its accent.
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"a": 0, "A": 1, "b": 2, "é": 3, "e": 4, " ": 5, "\t": 6},
                  "unk_token": "a"},
    }
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(tj))
    tm = build_token_map(p)
    assert tm.tolist() == [0, 0, 1, 2, 2, 3, 3]


def test_missing_tokenizer(tmp_path):
    with pytest.raises(TokenError, match="cannot load tokenizer"):
        build_token_map(tmp_path / "nope.json")
