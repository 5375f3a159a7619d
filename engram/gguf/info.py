""":func:`read_model`: the Engram part of a (split) GGUF model from its headers only (SPEC §6).

It parses the header of every shard (:mod:`.header`), orders a split set
(:mod:`.shards`), validates the Engram keys and derives what they leave out
(:mod:`.keys`), locates every tensor (:mod:`.tensors`) and checks the four
Engram tensors of each layer against the layout.  It never maps a file and
never reads tensor data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, Keys

from ..codec import ROW_BYTES, ROW_VALUES
from ..errors import ArgumentError, FormatError
from ..layout import Layout
from .header import Header, KeyValue, PathLike, load_strings, parse_header, strings_digest
from .keys import HC_STREAMS, HIDDEN_SIZE, EngramKeys, KeySource, engram_keys
from .shards import order_shards, shard_paths
from .tensors import (ENGRAM_TENSOR_RE, EngramLayer, TableLocation, TensorLocation, engram_layer_ids, expect_tensor,
                      locate, read_tensor_data)

__all__ = ["ModelInfo", "read_model", "read_headers"]


@dataclass(frozen=True, eq=False)
class ModelInfo:
    """What :func:`read_model` learned from the headers of a model.

    Attributes
    ----------
    paths : tuple[pathlib.Path, ...]
        The shards in ``split.no`` order (one path for an unsplit file).
    file_sizes : tuple[int, ...]
        Size in bytes of each shard (apparent size; sparse files count holes).
    architecture : str
        ``general.architecture`` (``"deepseek41"``); prefix of the Engram keys.
    version : int
        GGUF version (3).
    alignment : int
        ``general.alignment`` (16384 for the released model; GGUF default 32).
    encoding : str
        Row encoding, ``"e4m3_e8m0_32_row264"``.
    layout : Layout
        The validated layout, rebuilt from primes and multipliers (SPEC §2).
    token_map : numpy.ndarray
        int32 ``[vocab]``: compressed id of each token id (SPEC §3), read-only.
    eps : float
        The gate's epsilon (SPEC §7): ``{arch}.attention.layer_norm_rms_epsilon``,
        or :data:`engram.gguf.keys.DEFAULT_EPS` when the file has none
        (``sources["eps"].kind == "default"``).
    layers : dict[int, EngramLayer]
        Layer id -> its table, ``engram_kv``, ``engram_q_norm`` and ``engram_k_norm``.
    tables : dict[int, TableLocation]
        Layer id -> table location (the same objects as ``layers[L].table``).
    tensors : dict[str, TensorLocation]
        Every tensor of every shard by name.
    metadata : dict[str, KeyValue]
        Every metadata entry of the first shard (see :class:`KeyValue` for what
        is kept of array values).
    data_offsets : tuple[int, ...]
        Absolute offset where each shard's tensor data section begins.
    sources : dict[str, KeySource]
        Where each Engram constant came from: a key (``"key"``), only its legacy
        ``deepseek4.*`` spelling (``"legacy key"``), both (``"keys"``), derived
        from the rest (``"derived"``) or a default (``"default"``); names are
        ``encoding``, ``layer_ids``, ``primes``, ``multipliers``, ``pad_id``,
        ``token_map``, ``rows``, ``offsets``, ``head_count``,
        ``max_ngram_size``, ``key_length``, ``compressed_vocab_size``, ``eps``,
        ``embedding_length``.
    hidden_size : int
        Width of a residual stream (5120): ``{arch}.embedding_length``, or the
        first dimension of the norm tensors.

    The string arrays of the metadata (the vocabulary ``tokenizer.ggml.tokens``
    and ``tokenizer.ggml.merges``) are only located by :func:`read_model`;
    :meth:`strings` and :meth:`strings_digest` read them on first use and keep
    the result.
    """

    paths: Tuple[Path, ...]
    file_sizes: Tuple[int, ...]
    architecture: str
    version: int
    alignment: int
    encoding: str
    layout: Layout
    token_map: np.ndarray
    eps: float
    layers: Dict[int, EngramLayer]
    tables: Dict[int, TableLocation]
    tensors: Dict[str, TensorLocation]
    metadata: Dict[str, KeyValue] = field(repr=False)
    data_offsets: Tuple[int, ...] = ()
    sources: Dict[str, KeySource] = field(default_factory=dict, repr=False)
    hidden_size: int = HIDDEN_SIZE
    _cache: Dict[Tuple[str, str], object] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> Path:
        """The first shard (the one holding the metadata)."""
        return self.paths[0]

    @property
    def split_count(self) -> int:
        return len(self.paths)

    @property
    def derived(self) -> Tuple[str, ...]:
        """Names of the constants the file left out (derived or defaulted), e.g. ``("rows", "offsets")``."""
        return tuple(name for name, src in self.sources.items() if src.derived)

    def _string_array(self, key: str) -> Optional[KeyValue]:
        kv = self.metadata.get(key)
        if kv is None:
            return None
        if kv.type != GGUFValueType.ARRAY or kv.subtype != GGUFValueType.STRING:
            raise FormatError(f"{self.path}: {key}: has type {kv.describe_type()}, expected ARRAY[STRING] "
                              f"(byte offset {kv.offset})")
        return kv

    def strings(self, key: str) -> Optional[List[str]]:
        """The strings of metadata array ``key`` (e.g. ``"tokenizer.ggml.tokens"``), or None when absent.

        Read from the file on first use (one read of the array, ~30 ms for a
        129,280-token vocabulary) and kept; the list returned is shared, do not
        change it.

        Raises
        ------
        FormatError
            ``key`` is not an array of strings, or holds a string that is not UTF-8.
        TableIOError
            The read failed.
        """
        kv = self._string_array(key)
        if kv is None:
            return None
        got = self._cache.get(("strings", key))
        if got is None:
            got = self._cache[("strings", key)] = load_strings(kv)
        return got  # type: ignore[return-value]

    def strings_digest(self, key: str) -> Optional[str]:
        """SHA-256 (hex) of metadata string array ``key`` as stored, or None when absent.

        Equal to :func:`engram.gguf.header.digest_of_strings` of its strings.  One
        read of the array's bytes on first use (a few ms for a vocabulary), then
        kept.  Raises as :meth:`strings`.
        """
        kv = self._string_array(key)
        if kv is None:
            return None
        got = self._cache.get(("digest", key))
        if got is None:
            got = self._cache[("digest", key)] = strings_digest(kv)
        return got  # type: ignore[return-value]

    def vocabulary_summary(self) -> Optional[dict]:
        """What the file says of its tokenizer, or None without ``tokenizer.ggml.tokens``.

        ``{"tokens": n, "merges": n or None, "model": "gpt2", "pre": "deepseek-v3",
        "digest": SHA-256 hex of the token strings}`` (``model``/``pre`` None when
        absent).  Reads the token array once (a few ms), then kept.
        """
        tokens = self._string_array(Keys.Tokenizer.LIST)
        if tokens is None:
            return None
        merges = self._string_array(Keys.Tokenizer.MERGES)

        def text(key: str) -> Optional[str]:
            kv = self.metadata.get(key)
            return kv.value if kv is not None and kv.type == GGUFValueType.STRING else None

        return {"tokens": tokens.count, "merges": merges.count if merges is not None else None,
                "model": text(Keys.Tokenizer.MODEL), "pre": text(Keys.Tokenizer.PRE),
                "digest": self.strings_digest(Keys.Tokenizer.LIST)}

    def read_tensor(self, name: str, max_bytes: int = 1 << 30) -> np.ndarray:
        """Read one small tensor (``engram_kv``, the norms) into a new numpy array.

        Returns an array of the tensor's numpy dtype and numpy shape (e.g. float16
        ``(25600, 6144)`` for ``blk.L.engram_kv.weight``).

        Raises
        ------
        ArgumentError
            Unknown tensor, an Engram table (tables are read row by row, never
            whole), a block-quantized type, or more than ``max_bytes`` bytes.
        TableIOError
            The read came back short.
        """
        loc = self.tensors.get(name)
        if loc is None:
            raise ArgumentError(f"no tensor {name!r} in {self.path}")
        if any(t.offset == loc.offset and t.path == loc.path for t in self.tables.values()):
            raise ArgumentError(f"{name} is an Engram table; read its rows, never the whole table")
        return read_tensor_data(loc, max_bytes)

    def to_dict(self) -> dict:
        """A JSON-ready summary (used by ``engram inspect --json``)."""
        return {
            "paths": [str(p) for p in self.paths],
            "file_sizes": list(self.file_sizes),
            "architecture": self.architecture,
            "version": self.version,
            "alignment": self.alignment,
            "encoding": self.encoding,
            "eps": self.eps,
            "hidden_size": self.hidden_size,
            "layout": self.layout.to_dict(),
            "token_map": {"entries": int(self.token_map.shape[0]),
                          "max": int(self.token_map.max()) if self.token_map.size else -1},
            "vocabulary": self.vocabulary_summary(),
            "sources": {name: str(src) for name, src in self.sources.items()},
            "derived": list(self.derived),
            "data_offsets": list(self.data_offsets),
            "tables": {str(k): v.to_dict() for k, v in self.tables.items()},
            "tensors": [t.to_dict() for t in sorted(self.tensors.values(), key=lambda t: (t.shard, t.offset))],
        }


# ====================================================================== steps
def read_headers(path: Union[PathLike, Sequence[PathLike]]) -> List[Header]:
    """The parsed headers of a model file or split set, in ``split.no`` order (see :func:`read_model`)."""
    if isinstance(path, (str, os.PathLike)):
        paths = shard_paths(path)
        from_names = len(paths) > 1
    else:
        if isinstance(path, bytes) or not isinstance(path, Sequence) \
                or not all(isinstance(p, (str, os.PathLike)) for p in path):
            raise ArgumentError(f"read_model: expected a path or a sequence of paths, got {path!r:.200}")
        paths = [Path(p) for p in path]
        from_names = False
        if not paths:
            raise ArgumentError("read_model: empty list of shard paths")
        if len(set(p.resolve() for p in paths)) != len(paths):
            raise ArgumentError("read_model: the same shard is listed twice")
    return order_shards([parse_header(p) for p in paths], from_names)


def _hidden_size(keys: EngramKeys, tensors: Dict[str, TensorLocation], sources: Dict[str, KeySource]) -> int:
    """``{arch}.embedding_length``, else the first dimension of the first layer's q norm, else 5120."""
    if keys.hidden_size is not None:
        return keys.hidden_size
    name = f"blk.{keys.layout.layer_ids[0]}.engram_q_norm.weight"
    loc = tensors.get(name)
    if loc is not None and len(loc.gguf_shape) == 2:
        sources["embedding_length"] = KeySource("derived", f"ne0 of {name}")
        return int(loc.gguf_shape[0])
    sources["embedding_length"] = KeySource("default", f"{HIDDEN_SIZE} (SPEC §7)")
    return HIDDEN_SIZE


def check_engram_tensors(keys: EngramKeys, tensors: Dict[str, TensorLocation], hidden: int, path: Path
                         ) -> Dict[int, EngramLayer]:
    """The four Engram tensors of every layer, checked against the layout (SPEC §6 table)."""
    layout, arch = keys.layout, keys.architecture
    ids = set(layout.layer_ids)
    lid_src = keys.sources["layer_ids"]
    lid_from = "the layers of the table tensors" if lid_src.derived else lid_src.detail.split(" = ")[0]
    for name, loc in tensors.items():
        mt = ENGRAM_TENSOR_RE.match(name)
        if mt and int(mt.group(1)) not in ids:
            raise FormatError(f"{loc.path}: tensor {name} belongs to layer {mt.group(1)}, which is not in "
                              f"{lid_from} {list(layout.layer_ids)}")
    rows_from = ("the sum of its primes (the file has no rows key)" if keys.sources["rows"].derived
                 else keys.sources["rows"].detail.split(" = ")[0])
    hid_from = str(keys.sources.get("embedding_length", "")) or f"{arch}.embedding_length"
    width = layout.columns * ROW_VALUES
    layers: Dict[int, EngramLayer] = {}
    for li, lid in enumerate(layout.layer_ids):
        rows = int(layout.rows[li])
        pre = f"blk.{lid}."
        embd = expect_tensor(tensors, pre + "engram_embd.weight", GGMLQuantizationType.I8, (ROW_BYTES, rows), path,
                             f"{rows} rows of {ROW_BYTES} bytes, from {rows_from}")
        kv = expect_tensor(tensors, pre + "engram_kv.weight", GGMLQuantizationType.F16,
                           (width, (HC_STREAMS + 1) * hidden), path,
                           f"{layout.columns} columns x {ROW_VALUES} values -> {HC_STREAMS} keys + 1 value of "
                           f"{hidden} ({hid_from})")
        qn = expect_tensor(tensors, pre + "engram_q_norm.weight", GGMLQuantizationType.F32, (hidden, HC_STREAMS),
                           path, f"one RMSNorm weight of {hidden} ({hid_from}) per stream")
        kn = expect_tensor(tensors, pre + "engram_k_norm.weight", GGMLQuantizationType.F32, (hidden, HC_STREAMS),
                           path, f"one RMSNorm weight of {hidden} ({hid_from}) per stream")
        table = TableLocation(lid, embd.path, embd.shard, embd.offset, rows, ROW_BYTES)
        layers[lid] = EngramLayer(lid, table, kv, qn, kn)
    return layers


# ====================================================================== entry point
def read_model(path: Union[PathLike, Sequence[PathLike]]) -> ModelInfo:
    """Read and validate the Engram part of a model from its GGUF headers (SPEC §2, §3, §6).

    Parameters
    ----------
    path : path or sequence of paths
        A model file; one shard of a split set named ``NAME-0000k-of-0000N.gguf``
        (its siblings are found beside it); or the list of all shard paths in any
        order (ordered by ``split.no``).

    Returns
    -------
    ModelInfo
        Layout, token map, epsilon and the location of every Engram tensor.
        Only headers are read: no tensor data, no memory map.  Keys spelled
        ``deepseek4.engram.*`` (older converters) are read as aliases of
        ``deepseek41.engram.*``; constants the file leaves out are derived
        (``ModelInfo.sources`` says which; see :mod:`engram.gguf.keys`).

    Raises
    ------
    FormatError
        Naming the key, tensor, file and offset, and for arrays the entry and
        both values: a malformed or truncated header (wrong magic, version other
        than 3, absurd counts or lengths, unknown types); a missing shard or
        contradicting ``split.*`` keys; missing primary Engram keys or mistyped
        ones; two spellings of a key that disagree; a layout that breaks SPEC §2
        (even multipliers, ...); ``rows``, ``offsets``, ``head_count``,
        ``max_ngram_size``, ``key_length`` or ``compressed_vocab_size``
        contradicting what the rest derives (the message gives the ``engram
        repair`` command that rewrites them); token-map entries outside the
        compressed vocabulary; a missing Engram tensor or one of the wrong type
        or shape (``engram_embd`` I8 ``[264, rows]``, ``engram_kv`` F16 ``[6144,
        25600]``, norms F32 ``[5120, 4]``, GGUF order); tensor data misaligned,
        overlapping, or past the end of its file; a path that is a directory,
        FIFO or device rather than a regular file.
    TableIOError
        Reading a header failed (``EIO`` and the like; names file and offset).
    ArgumentError
        ``path`` is neither a path nor a sequence of paths.
    """
    headers = read_headers(path)
    return model_info(headers, engram_keys(headers[0], engram_layer_ids(headers)))


def model_info(headers: List[Header], keys: EngramKeys) -> ModelInfo:
    """Locate and check the tensors of ``headers`` against ``keys``; the :class:`ModelInfo`."""
    first = headers[0]
    tensors = locate(headers)
    sources = dict(keys.sources)
    hidden = _hidden_size(keys, tensors, sources)
    keys = EngramKeys(keys.architecture, keys.encoding, keys.layout, keys.token_map, keys.eps, hidden, sources)
    layers = check_engram_tensors(keys, tensors, hidden, first.path)
    return ModelInfo(
        paths=tuple(h.path for h in headers),
        file_sizes=tuple(h.size for h in headers),
        architecture=keys.architecture,
        version=first.version,
        alignment=first.alignment,
        encoding=keys.encoding,
        layout=keys.layout,
        token_map=keys.token_map,
        eps=keys.eps,
        layers=layers,
        tables={lid: layer.table for lid, layer in layers.items()},
        tensors=tensors,
        metadata=dict(first.kv),
        data_offsets=tuple(h.data_offset for h in headers),
        sources=sources,
        hidden_size=hidden,
    )
