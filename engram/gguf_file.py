"""Read the Engram part of a (split) GGUF model file from its headers only (SPEC §6).

:func:`read_model` parses the GGUF header, the metadata (key/value) section and
the tensor infos of every shard with small bounded reads, validates the Engram
metadata against itself and against the tensors, and returns a
:class:`ModelInfo`: the :class:`~engram.layout.Layout`, the token map, the gate
epsilon and where every Engram tensor lives (file, absolute byte offset, type,
shape).  It never maps the file and never reads tensor data: a table is about
94 GiB and may be a sparse extent full of holes.

``gguf.GGUFReader`` memory-maps the whole file and builds a numpy view per
field, which is what the tables must not be subjected to, so the parser here is
a small one of its own that uses the ``gguf`` package's constants
(``GGUF_MAGIC``, ``GGUFValueType``, ``GGMLQuantizationType``,
``GGML_QUANT_SIZES``).  Every count read from a header (string and array
lengths, key and tensor counts, dimensions) is checked against the bytes left in
the file and against a fixed limit *before* anything is allocated, so a
malformed or hostile header cannot drive a large allocation.

Every contradiction raises :class:`~engram.errors.FormatError` naming the key or
tensor, and the file and byte offset where that helps.
"""

from __future__ import annotations

import math
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from .errors import ArgumentError, FormatError, LayoutError, TableIOError
from .layout import Layout

__all__ = [
    "ARCHITECTURE", "ENCODING", "ROW_VALUES", "ROW_BYTES", "HIDDEN_SIZE", "HC_STREAMS",
    "KeyValue", "TensorLocation", "TableLocation", "EngramLayer", "ModelInfo",
    "read_model", "shard_paths", "read_kv",
]

PathLike = Union[str, os.PathLike]

#: ``general.architecture`` of DeepSeek V4.1 models; the Engram keys use it as prefix.
ARCHITECTURE = "deepseek41"
#: The only row encoding this engine reads (SPEC §5).
ENCODING = "e4m3_e8m0_32_row264"
#: Values in one table row (SPEC §2).
ROW_VALUES = 256
#: Bytes of one table row: 256 E4M3 codes + 8 E8M0 scales (SPEC §5).
ROW_BYTES = 264
#: Width of a residual stream, the gate's ``width`` (SPEC §7).
HIDDEN_SIZE = 5120
#: Hyper-connection residual streams per token (SPEC §1, §7).
HC_STREAMS = 4
#: The GGUF version this parser reads.
GGUF_VERSION = 3
#: Alignment of the released model's tensor data (SPEC §6).
MODEL_ALIGNMENT = 16384

# ---------------------------------------------------------------- limits
#: Sane limits on header counts, checked before any allocation.  Real models
#: stay far below them (V4.1 Flash: ~40 keys, ~1,500 tensors, 129,280-entry arrays,
#: chat templates of a few KB).
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20
MAX_KEY_BYTES = 1 << 16
MAX_NAME_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 20
MAX_ARRAY_ELEMENTS = 1 << 26
MAX_ARRAY_DEPTH = 4
MAX_DIMS = 4  # GGML_MAX_DIMS
#: Numeric arrays up to this many elements are kept in :attr:`KeyValue.value`
#: while parsing; longer ones are only located (:attr:`KeyValue.data_offset`) and
#: read on demand, with a per-key limit, when the Engram metadata needs them.
INLINE_ARRAY_ELEMENTS = 1024
#: Longest token map read (entries); 4x the largest vocabulary in use today.
MAX_TOKEN_MAP = 1 << 20
MAX_ALIGNMENT = 1 << 30

_READ_BLOCK = 1 << 16

_SCALAR = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}
_INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})

_NUMPY_OF_GGML = {
    GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"), GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"), GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}

_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_ENGRAM_TENSOR_RE = re.compile(r"^blk\.(\d+)\.engram_[A-Za-z0-9_]+\.weight$")

#: Our own module-level alias, so tests can watch every byte range the parser reads.
_pread = os.pread


def _pad(x: int, n: int) -> int:
    return ((x + n - 1) // n) * n


def _close(fd: int) -> None:
    """Close ``fd``, dropping an error from close(2) (EIO, ENOTCONN from a FUSE server that is
    gone): Linux releases the descriptor anyway, and the caller's own error must not be masked."""
    try:
        os.close(fd)
    except OSError:
        pass


def _open_regular(path: Path) -> int:
    """Open ``path`` read-only; it must be a regular file.

    ``O_NONBLOCK`` keeps the open itself from waiting for a writer when the
    path is a FIFO; it is cleared again once the file is known to be regular.
    Raises ``OSError`` from the open, ``FormatError`` for a directory, FIFO,
    device or socket.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "not a regular file")
            raise FormatError(f"{path}: is {kind}; a model is a regular .gguf file")
        if getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        _close(fd)
        raise
    return fd


# ================================================================ results
@dataclass(frozen=True)
class KeyValue:
    """One metadata entry of a GGUF header.

    ``value`` is a Python scalar or ``str`` for scalar types, a read-only numpy
    array for numeric arrays of at most :data:`INLINE_ARRAY_ELEMENTS` elements
    (or longer ones the Engram metadata needed, such as the token map), and
    ``None`` for arrays only located (other long numeric arrays, arrays of
    strings, nested arrays); ``count`` is the array length (``None`` for
    scalars).  ``offset`` is the byte offset of the entry (its key) in ``path``;
    ``data_offset`` that of a numeric array's first element (-1 otherwise).
    """

    key: str
    type: GGUFValueType
    value: Any
    offset: int
    path: Path
    subtype: Optional[GGUFValueType] = None
    count: Optional[int] = None
    data_offset: int = -1

    def describe_type(self) -> str:
        if self.type == GGUFValueType.ARRAY:
            return f"ARRAY[{self.subtype.name if self.subtype is not None else '?'}]"
        return self.type.name


@dataclass(frozen=True)
class TensorLocation:
    """Where one tensor's data lies.

    Attributes
    ----------
    name : str
        Tensor name, e.g. ``"blk.1.engram_kv.weight"``.
    path : pathlib.Path
        The shard that holds the data.
    shard : int
        Index of that shard (``split.no``; 0 for a single file).
    offset : int
        Absolute byte offset of the first data byte in ``path``.
    nbytes : int
        Size of the data in bytes.
    ggml_type : gguf.GGMLQuantizationType
        GGUF tensor type.
    gguf_shape : tuple[int, ...]
        Dimensions in GGUF order ``(ne0, ne1, ...)``, ``ne0`` fastest varying.
    info_offset : int
        Byte offset of the tensor's info record in the header of ``path``.
    """

    name: str
    path: Path
    shard: int
    offset: int
    nbytes: int
    ggml_type: GGMLQuantizationType
    gguf_shape: Tuple[int, ...]
    info_offset: int = -1

    @property
    def shape(self) -> Tuple[int, ...]:
        """numpy shape (the GGUF dimensions reversed), e.g. ``(25600, 6144)`` for ``engram_kv``."""
        return tuple(reversed(self.gguf_shape))

    @property
    def dtype(self) -> Optional[np.dtype]:
        """numpy dtype of the elements, or ``None`` for block-quantized types."""
        return _NUMPY_OF_GGML.get(self.ggml_type)

    @property
    def end(self) -> int:
        """One past the last data byte (absolute file offset)."""
        return self.offset + self.nbytes

    def to_dict(self) -> dict:
        return {
            "name": self.name, "path": str(self.path), "shard": self.shard, "offset": self.offset,
            "nbytes": self.nbytes, "type": self.ggml_type.name, "gguf_shape": list(self.gguf_shape),
            "shape": list(self.shape),
        }


@dataclass(frozen=True)
class TableLocation:
    """One layer's Engram table (``blk.L.engram_embd.weight``, SPEC §6).

    Row ``r`` occupies bytes ``[offset + r * row_bytes, offset + (r + 1) * row_bytes)``
    of ``path``.

    Attributes
    ----------
    layer_id : int
        Decoder layer of the table.
    path : pathlib.Path
        The shard holding the table.
    shard : int
        Index of that shard.
    offset : int
        Absolute byte offset of row 0 (above 2**33 in the released model).
    rows : int
        Rows in the table (sum of the layer's primes).
    row_bytes : int
        Bytes per row, 264.
    """

    layer_id: int
    path: Path
    shard: int
    offset: int
    rows: int
    row_bytes: int = ROW_BYTES

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def end(self) -> int:
        """One past the last byte of the last row (absolute file offset)."""
        return self.offset + self.nbytes

    def row_offset(self, row: int) -> int:
        """Absolute byte offset of ``row``; ``ArgumentError`` outside ``[0, rows)``."""
        if not 0 <= int(row) < self.rows:
            raise ArgumentError(f"row {row} outside table of layer {self.layer_id} [0, {self.rows})")
        return self.offset + int(row) * self.row_bytes

    def to_dict(self) -> dict:
        return {"layer_id": self.layer_id, "path": str(self.path), "shard": self.shard,
                "offset": self.offset, "rows": self.rows, "row_bytes": self.row_bytes,
                "nbytes": self.nbytes, "end": self.end}


@dataclass(frozen=True)
class EngramLayer:
    """The four Engram tensors of one layer (SPEC §6)."""

    layer_id: int
    table: TableLocation
    kv: TensorLocation
    q_norm: TensorLocation
    k_norm: TensorLocation


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
        ``{arch}.attention.layer_norm_rms_epsilon``, the gate's epsilon (SPEC §7).
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

    @property
    def path(self) -> Path:
        """The first shard (the one holding the metadata)."""
        return self.paths[0]

    @property
    def split_count(self) -> int:
        return len(self.paths)

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
        if loc.dtype is None:
            raise ArgumentError(f"{name}: type {loc.ggml_type.name} is block-quantized; not readable as an array")
        if loc.nbytes > max_bytes:
            raise ArgumentError(f"{name}: {loc.nbytes} bytes exceeds max_bytes={max_bytes}")
        out = np.empty(loc.shape, dtype=loc.dtype)
        buf = memoryview(out.reshape(-1).view(np.uint8))
        try:
            fd = _open_regular(loc.path)
        except OSError as exc:
            raise TableIOError(f"{loc.path}: cannot open to read {name}: {exc.strerror}", errno_=exc.errno) from None
        try:
            done = 0
            while done < loc.nbytes:
                try:
                    n = os.preadv(fd, [buf[done:]], loc.offset + done)
                except OSError as exc:
                    raise TableIOError(f"{loc.path}: reading {name} at offset {loc.offset + done} failed: "
                                       f"{exc.strerror}", offset=loc.offset + done, errno_=exc.errno) from None
                if n <= 0:
                    raise TableIOError(f"{loc.path}: short read of {name} at offset {loc.offset + done}",
                                       offset=loc.offset + done)
                done += n
        finally:
            _close(fd)
        return out

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
            "layout": self.layout.to_dict(),
            "token_map": {"entries": int(self.token_map.shape[0]),
                          "max": int(self.token_map.max()) if self.token_map.size else -1},
            "data_offsets": list(self.data_offsets),
            "tables": {str(k): v.to_dict() for k, v in self.tables.items()},
            "tensors": [t.to_dict() for t in sorted(self.tensors.values(), key=lambda t: (t.shard, t.offset))],
        }


# ================================================================ bounded reader
class _Cursor:
    """Sequential little-endian reader over a file with bounded, buffered reads."""

    def __init__(self, fd: int, size: int, path: Path):
        self.fd = fd
        self.size = size
        self.path = path
        self.pos = 0
        self._buf = b""
        self._buf_start = 0

    def fail(self, msg: str, offset: Optional[int] = None) -> FormatError:
        off = self.pos if offset is None else offset
        return FormatError(f"{self.path}: {msg} (at byte offset {off})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated header: {what} needs {n} bytes, only {self.size - self.pos} left in the file")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        start = self.pos - self._buf_start
        if 0 <= start and start + n <= len(self._buf):
            out = self._buf[start:start + n]
        elif n <= _READ_BLOCK:
            want = min(_READ_BLOCK, self.size - self.pos)
            self._buf = self._read_exact(self.pos, want, what)
            self._buf_start = self.pos
            out = self._buf[:n]
        else:
            out = self._read_exact(self.pos, n, what)
        self.pos += n
        return out

    def _read_exact(self, offset: int, n: int, what: str) -> bytes:
        parts = []
        got = 0
        while got < n:
            try:
                b = _pread(self.fd, n - got, offset + got)
            except OSError as exc:
                raise TableIOError(f"{self.path}: reading {what} at byte offset {offset + got} failed: "
                                   f"{exc.strerror}", offset=offset + got, errno_=exc.errno) from None
            if not b:
                raise self.fail(f"truncated file while reading {what}", offset + got)
            parts.append(b)
            got += len(b)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str, limit: int) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > limit:
            raise self.fail(f"{what}: string length {n} exceeds the limit of {limit} bytes", at)
        if n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} runs past the end of the file "
                            f"({self.size - self.pos} bytes left)", at)
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: string is not valid UTF-8", at) from None

    def skip_string(self, what: str, limit: int) -> None:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > limit or n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} exceeds the limit or the file", at)
        self.skip(n, what)


# ================================================================ header parsing
@dataclass
class _TensorInfo:
    name: str
    dims: Tuple[int, ...]
    ggml_type: GGMLQuantizationType
    rel_offset: int
    nbytes: int
    info_offset: int


@dataclass
class _Header:
    path: Path
    size: int
    version: int
    kv: Dict[str, KeyValue]
    tensors: List[_TensorInfo]
    alignment: int
    data_offset: int


def _value_type(cur: _Cursor, raw: int, what: str, at: int) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what}: unknown value type {raw}", at) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, depth: int = 0):
    """Read (or skip) one value; returns ``(value, subtype, count, data_offset)``."""
    fmt = _SCALAR.get(vtype)
    if fmt is not None:
        raw = cur.take(np.dtype(fmt).itemsize, key)
        v = np.frombuffer(raw, dtype=fmt)[0]
        if vtype == GGUFValueType.BOOL:
            return bool(v), None, None, -1
        return (float(v) if vtype in _FLOAT_TYPES else int(v)), None, None, -1
    if vtype == GGUFValueType.STRING:
        return cur.string(key, MAX_STRING_BYTES), None, None, -1
    if vtype == GGUFValueType.ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise cur.fail(f"{key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        at = cur.pos
        sub = _value_type(cur, cur.u32(f"{key} element type"), key, at)
        at = cur.pos
        count = cur.u64(f"{key} length")
        if count > MAX_ARRAY_ELEMENTS:
            raise cur.fail(f"{key}: array length {count} exceeds the limit of {MAX_ARRAY_ELEMENTS}", at)
        fmt = _SCALAR.get(sub)
        min_size = np.dtype(fmt).itemsize if fmt is not None else (8 if sub == GGUFValueType.STRING else 12)
        left = cur.size - cur.pos
        if count * min_size > left:
            raise cur.fail(f"{key}: array of {count} {sub.name} elements needs at least {count * min_size} "
                           f"bytes, only {left} left in the file", at)
        if fmt is not None:
            nbytes = count * np.dtype(fmt).itemsize
            at = cur.pos
            if count <= INLINE_ARRAY_ELEMENTS:
                arr = _as_array(cur.take(nbytes, key), fmt, sub)
                return arr, sub, count, at
            cur.skip(nbytes, key)
            return None, sub, count, at
        if sub == GGUFValueType.STRING:
            for i in range(count):
                cur.skip_string(f"{key}[{i}]", MAX_STRING_BYTES)
            return None, sub, count, -1
        for i in range(count):  # nested arrays: walk and drop
            _read_value(cur, sub, f"{key}[{i}]", depth + 1)
        return None, sub, count, -1
    raise cur.fail(f"{key}: unknown value type {vtype}")  # pragma: no cover - GGUFValueType is closed


def _as_array(raw: bytes, fmt: str, sub: GGUFValueType) -> np.ndarray:
    arr = np.frombuffer(raw, dtype=fmt)
    if sub == GGUFValueType.BOOL:
        arr = arr.astype(bool)
    arr.setflags(write=False)
    return arr


def _load_array(kv: KeyValue) -> np.ndarray:
    """Read a numeric array that parsing only located (bounds were checked then)."""
    fmt = _SCALAR[kv.subtype]
    n = kv.count * np.dtype(fmt).itemsize
    try:
        fd = _open_regular(kv.path)
    except OSError as exc:
        raise TableIOError(f"{kv.path}: cannot open to read {kv.key}: {exc.strerror}", errno_=exc.errno) from None
    try:
        cur = _Cursor(fd, os.fstat(fd).st_size, kv.path)
        cur.pos = kv.data_offset
        return _as_array(cur.take(n, kv.key), fmt, kv.subtype)
    finally:
        _close(fd)


def _parse_header(path: Path) -> _Header:
    try:
        fd = _open_regular(path)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such model file") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot open ({exc.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        cur = _Cursor(fd, size, path)
        magic_raw = cur.take(4, "magic") if size >= 4 else None
        if magic_raw is None or struct.unpack("<I", magic_raw)[0] != GGUF_MAGIC:
            raise FormatError(f"{path}: not a GGUF file: magic {magic_raw!r} at byte offset 0, expected b'GGUF'")
        version = cur.u32("version")
        if version != GGUF_VERSION:
            if struct.unpack(">I", struct.pack("<I", version))[0] in (1, 2, 3):
                raise FormatError(f"{path}: big-endian GGUF files are not supported (byte offset 4)")
            raise FormatError(f"{path}: GGUF version {version} at byte offset 4 is not supported (need 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata key count")
        left = size - cur.pos
        if n_kv > MAX_KV or n_kv * 13 > left:
            raise FormatError(f"{path}: metadata key count {n_kv} at byte offset 16 is impossible "
                              f"(limit {MAX_KV}, {left} header bytes left)")
        if n_tensors > MAX_TENSORS or n_tensors * 32 > left:
            raise FormatError(f"{path}: tensor count {n_tensors} at byte offset 8 is impossible "
                              f"(limit {MAX_TENSORS}, {left} header bytes left)")
        kv: Dict[str, KeyValue] = {}
        for i in range(n_kv):
            at = cur.pos
            key = cur.string(f"metadata key #{i}", MAX_KEY_BYTES)
            if not key:
                raise cur.fail(f"metadata key #{i} is empty", at)
            if key in kv:
                raise cur.fail(f"duplicate metadata key {key!r} (first at byte offset {kv[key].offset})", at)
            t_at = cur.pos
            vtype = _value_type(cur, cur.u32(f"{key} type"), key, t_at)
            value, sub, count, data_at = _read_value(cur, vtype, key)
            kv[key] = KeyValue(key, vtype, value, at, path, sub, count, data_at)
        alignment = GGUF_DEFAULT_ALIGNMENT
        if "general.alignment" in kv:
            a = kv["general.alignment"]
            if a.type not in _INT_TYPES:
                raise FormatError(f"{path}: general.alignment has type {a.describe_type()}, expected UINT32 "
                                  f"(byte offset {a.offset})")
            alignment = int(a.value)
            if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
                raise FormatError(f"{path}: general.alignment = {alignment} is not a power of two "
                                  f"<= {MAX_ALIGNMENT} (byte offset {a.offset})")
        tensors: List[_TensorInfo] = []
        names: Dict[str, int] = {}
        for i in range(n_tensors):
            at = cur.pos
            name = cur.string(f"tensor #{i} name", MAX_NAME_BYTES)
            if name in names:
                raise cur.fail(f"duplicate tensor {name!r} (first info at byte offset {names[name]})", at)
            names[name] = at
            nd_at = cur.pos
            n_dims = cur.u32(f"{name} n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail(f"tensor {name}: n_dims = {n_dims}, must be 1..{MAX_DIMS}", nd_at)
            dims = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"{name} dimensions"))
            t_at = cur.pos
            raw_type = cur.u32(f"{name} type")
            try:
                gtype = GGMLQuantizationType(raw_type)
                block, type_size = GGML_QUANT_SIZES[gtype]
            except (ValueError, KeyError):
                raise cur.fail(f"tensor {name}: unknown tensor type {raw_type}", t_at) from None
            rel = cur.u64(f"{name} offset")
            if any(d >= 2**63 for d in dims):
                raise cur.fail(f"tensor {name}: dimension {list(dims)} out of range", nd_at)
            if dims[0] % block:
                raise cur.fail(f"tensor {name}: ne0 = {dims[0]} is not a multiple of the "
                               f"{gtype.name} block size {block}", nd_at)
            nbytes = math.prod(dims) // block * type_size
            if nbytes >= 2**63:
                raise cur.fail(f"tensor {name}: {list(dims)} {gtype.name} is {nbytes} bytes, impossibly large", nd_at)
            tensors.append(_TensorInfo(name, tuple(int(d) for d in dims), gtype, rel, nbytes, at))
        data_offset = _pad(cur.pos, alignment)
        return _Header(path, size, version, kv, tensors, alignment, data_offset)
    finally:
        _close(fd)


def read_kv(path: PathLike) -> Dict[str, KeyValue]:
    """The metadata entries of one GGUF file, read with bounded reads (no tensor data).

    Raises
    ------
    FormatError
        The header is malformed (names the key or offset).
    """
    return _parse_header(Path(path)).kv


# ================================================================ shards
def shard_paths(path: PathLike) -> List[Path]:
    """All shards of the split set that ``path`` belongs to, in order.

    ``NAME-00002-of-00004.gguf`` gives ``NAME-00001-of-00004.gguf`` ...
    ``NAME-00004-of-00004.gguf`` (llama.cpp's ``gguf-split`` names); any other
    name gives ``[path]``.

    Raises
    ------
    FormatError
        A sibling shard is missing, or the name counts shards impossibly.
    """
    p = Path(path)
    m = _SHARD_RE.match(p.name)
    if m is None:
        return [p]
    no, count = int(m.group("no")), int(m.group("count"))
    if count < 1 or not 1 <= no <= count:
        raise FormatError(f"{p}: shard name says shard {no} of {count}")
    paths = [p.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q for q in paths if not q.exists()]
    if missing:
        raise FormatError(f"{p}: shard {missing[0].name} of the {count}-file split set is missing"
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return paths


def _split_int(h: _Header, key: str) -> Optional[int]:
    kv = h.kv.get(key)
    if kv is None:
        return None
    if kv.type not in _INT_TYPES:
        raise FormatError(f"{h.path}: {key} has type {kv.describe_type()}, expected an integer "
                          f"(byte offset {kv.offset})")
    return int(kv.value)


def _order_shards(headers: List[_Header], from_names: bool) -> List[_Header]:
    n = len(headers)
    if n == 1:
        h = headers[0]
        count = _split_int(h, "split.count")
        if count is not None and count != 1:
            raise FormatError(f"{h.path}: split.count = {count} but only this file was given; name the shards "
                              f"NAME-0000k-of-0000N.gguf or pass the list of shard paths")
        no = _split_int(h, "split.no")
        if no not in (None, 0):
            raise FormatError(f"{h.path}: split.no = {no} in a single-file model")
        return headers
    by_no: Dict[int, _Header] = {}
    for i, h in enumerate(headers):
        no = _split_int(h, "split.no")
        count = _split_int(h, "split.count")
        if no is None or count is None:
            missing = "split.no" if no is None else "split.count"
            raise FormatError(f"{h.path}: shard of a {n}-file set lacks key {missing}")
        if count != n:
            raise FormatError(f"{h.path}: split.count = {count} but the set has {n} shards")
        if not 0 <= no < n:
            raise FormatError(f"{h.path}: split.no = {no} outside [0, {n})")
        if from_names and no != i:
            raise FormatError(f"{h.path}: split.no = {no} contradicts the file name (shard {i + 1} of {n})")
        if no in by_no:
            raise FormatError(f"{h.path}: split.no = {no} also claimed by {by_no[no].path}")
        by_no[no] = h
    ordered = [by_no[i] for i in range(n)]
    total = sum(len(h.tensors) for h in ordered)
    for h in ordered:
        tc = _split_int(h, "split.tensors.count")
        if tc is None and h is ordered[0]:
            raise FormatError(f"{h.path}: first shard lacks key split.tensors.count")
        if tc is not None and tc != total:
            raise FormatError(f"{h.path}: split.tensors.count = {tc} but the {n} shards hold {total} tensors")
    return ordered


# ================================================================ metadata checks
class _Meta:
    def __init__(self, h: _Header):
        self.h = h
        self.kv = h.kv

    def err(self, key: str, msg: str) -> FormatError:
        kv = self.kv.get(key)
        where = f" (byte offset {kv.offset})" if kv is not None else ""
        return FormatError(f"{self.h.path}: {key}: {msg}{where}")

    def get(self, key: str, required: bool = True) -> Optional[KeyValue]:
        kv = self.kv.get(key)
        if kv is None and required:
            raise FormatError(f"{self.h.path}: required metadata key {key} is missing")
        return kv

    def string(self, key: str) -> str:
        kv = self.get(key)
        if kv.type != GGUFValueType.STRING:
            raise self.err(key, f"has type {kv.describe_type()}, expected STRING")
        return kv.value

    def integer(self, key: str, required: bool = True, lo: int = 0, hi: int = 2**64 - 1) -> Optional[int]:
        kv = self.get(key, required)
        if kv is None:
            return None
        if kv.type not in _INT_TYPES:
            raise self.err(key, f"has type {kv.describe_type()}, expected an integer (UINT32)")
        v = int(kv.value)
        if not lo <= v <= hi:
            raise self.err(key, f"value {v} outside [{lo}, {hi}]")
        return v

    def number(self, key: str) -> float:
        kv = self.get(key)
        if kv.type not in _FLOAT_TYPES:
            raise self.err(key, f"has type {kv.describe_type()}, expected FLOAT32")
        return float(kv.value)

    def int_array(self, key: str, required: bool = True, length: Optional[int] = None,
                  max_len: int = INLINE_ARRAY_ELEMENTS) -> Optional[np.ndarray]:
        kv = self.get(key, required)
        if kv is None:
            return None
        if kv.type != GGUFValueType.ARRAY or kv.subtype not in _INT_TYPES:
            raise self.err(key, f"has type {kv.describe_type()}, expected an integer array")
        if kv.count > max_len:
            raise self.err(key, f"array of {kv.count} entries is longer than the limit of {max_len}")
        if length is not None and kv.count != length:
            raise self.err(key, f"has {kv.count} entries, expected {length}")
        arr = kv.value
        if arr is None:
            arr = _load_array(kv)
            self.kv[key] = KeyValue(kv.key, kv.type, arr, kv.offset, kv.path, kv.subtype, kv.count, kv.data_offset)
        if length is not None and arr.shape[0] != length:
            raise self.err(key, f"has {arr.shape[0]} entries, expected {length}")
        if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
            i = int(np.argmax(arr < 0))
            raise self.err(key, f"entry [{i}] = {int(arr[i])} is negative")
        return arr


_LAYOUT_FIELD_KEYS = {
    "layer_ids": "layer_ids", "primes": "primes", "multipliers": "multipliers",
    "compressed_vocab_size": "compressed_vocab_size", "pad_id": "pad_id", "rows": "rows",
    "heads": "head_count", "max_ngram": "max_ngram_size",
}


def _engram_metadata(h: _Header):
    """Validate the Engram keys of the first shard; returns (arch, layout, token_map, eps, hidden)."""
    m = _Meta(h)
    arch = m.string("general.architecture")
    if not arch:
        raise m.err("general.architecture", "is empty")
    p = f"{arch}.engram."
    if p + "encoding" not in m.kv:
        others = sorted({k[: -len(".engram.encoding")] for k in m.kv if k.endswith(".engram.encoding")})
        if others:
            raise FormatError(f"{h.path}: general.architecture is {arch!r} but the Engram keys use prefix "
                              f"{others[0]!r} (key {others[0]}.engram.encoding)")
        raise FormatError(f"{h.path}: no Engram metadata: required key {p}encoding is missing "
                          f"(general.architecture = {arch!r})")
    enc = m.string(p + "encoding")
    if enc != ENCODING:
        raise m.err(p + "encoding", f"row encoding {enc!r} is not supported (need {ENCODING!r})")
    heads = m.integer(p + "head_count", required=False, lo=1, hi=1 << 12)
    max_ngram = m.integer(p + "max_ngram_size", required=False, lo=2, hi=64)
    key_length = m.integer(p + "key_length", required=False)
    if key_length is not None and key_length != ROW_VALUES:
        raise m.err(p + "key_length", f"= {key_length} contradicts encoding {ENCODING} "
                                      f"({ROW_VALUES} values a row)")
    heads_v = 8 if heads is None else heads
    ngram_v = 4 if max_ngram is None else max_ngram
    cols = (ngram_v - 1) * heads_v
    layer_ids = m.int_array(p + "layer_ids", max_len=1024)
    n_layers = int(layer_ids.shape[0])
    if n_layers == 0:
        raise m.err(p + "layer_ids", "is empty")
    primes = m.int_array(p + "primes", max_len=1 << 16)
    if primes.shape[0] != n_layers * cols:
        from_ = "".join(f", {p}{k} = {v}" for k, v in (("head_count", heads), ("max_ngram_size", max_ngram))
                        if v is not None)
        raise m.err(p + "primes", f"has {primes.shape[0]} entries, expected {n_layers} layers x {cols} columns "
                                  f"= {n_layers * cols} (heads {heads_v}, max n-gram {ngram_v}{from_})")
    mults = m.int_array(p + "multipliers", max_len=1 << 16)
    if mults.shape[0] != n_layers * ngram_v:
        raise m.err(p + "multipliers", f"has {mults.shape[0]} entries, expected {n_layers} layers x "
                                       f"{ngram_v} lookbacks = {n_layers * ngram_v}")
    cvs = m.integer(p + "compressed_vocab_size", lo=1, hi=2**31 - 1)
    pad = m.integer(p + "pad_id")
    try:
        layout = Layout(
            layer_ids=tuple(int(x) for x in layer_ids),
            primes=primes.astype(np.uint64).reshape(n_layers, cols),
            multipliers=mults.astype(np.uint64).reshape(n_layers, ngram_v),
            compressed_vocab_size=cvs, pad_id=pad, heads=heads_v, max_ngram=ngram_v,
        )
    except LayoutError as exc:
        fld = str(exc).split(":", 1)[0]
        key = p + _LAYOUT_FIELD_KEYS.get(fld, fld)
        raise FormatError(f"{h.path}: {key}: {exc}") from None
    rows = m.int_array(p + "rows", length=n_layers)
    for li, lid in enumerate(layout.layer_ids):
        if int(rows[li]) != int(layout.rows[li]):
            raise m.err(p + "rows", f"layer {lid} has {int(rows[li])} rows but its primes sum to "
                                    f"{int(layout.rows[li])}")
    offsets = m.int_array(p + "offsets", required=False, length=n_layers * cols, max_len=1 << 16)
    if offsets is not None:
        o = offsets.astype(np.uint64).reshape(n_layers, cols)
        bad = np.argwhere(o != layout.offsets)
        if bad.size:
            li, c = (int(x) for x in bad[0])
            raise m.err(p + "offsets", f"layer {layout.layer_ids[li]} column {c} starts at row {int(o[li, c])}, "
                                       f"but the primes put it at {int(layout.offsets[li, c])}")
    tm = m.int_array(p + "token_map", max_len=MAX_TOKEN_MAP)
    if tm.shape[0] < cvs:
        raise m.err(p + "token_map", f"has {tm.shape[0]} entries, fewer than {p}compressed_vocab_size = {cvs} "
                                     f"(every compressed id is the image of some token id, SPEC §3)")
    over = np.flatnonzero(tm >= cvs)  # negatives were rejected above
    if over.size:
        i = int(over[0])
        raise m.err(p + "token_map", f"entry [{i}] = {int(tm[i])} is outside the compressed vocabulary "
                                     f"[0, {cvs}) of {p}compressed_vocab_size")
    vocab = m.integer(arch + ".vocab_size", required=False)
    if vocab is not None and vocab != tm.shape[0]:
        raise m.err(p + "token_map", f"has {tm.shape[0]} entries but {arch}.vocab_size = {vocab}")
    toks = m.kv.get("tokenizer.ggml.tokens")
    if toks is not None and toks.count is not None and toks.count != tm.shape[0]:
        raise m.err(p + "token_map", f"has {tm.shape[0]} entries but tokenizer.ggml.tokens has {toks.count}")
    token_map = tm.astype(np.int32)
    token_map.setflags(write=False)
    eps_key = f"{arch}.attention.layer_norm_rms_epsilon"
    eps = m.number(eps_key)
    if not (math.isfinite(eps) and 0.0 < eps < 1.0):
        raise m.err(eps_key, f"epsilon {eps!r} must be finite and in (0, 1)")
    hidden = m.integer(arch + ".embedding_length", required=False, lo=1, hi=1 << 20)
    return arch, enc, layout, token_map, eps, (HIDDEN_SIZE if hidden is None else hidden)


# ================================================================ tensors
def _locate(headers: List[_Header]) -> Dict[str, TensorLocation]:
    out: Dict[str, TensorLocation] = {}
    for shard, h in enumerate(headers):
        spans = []
        for t in h.tensors:
            if t.name in out:
                raise FormatError(f"{h.path}: tensor {t.name} also appears in {out[t.name].path}")
            if t.rel_offset % h.alignment:
                raise FormatError(f"{h.path}: tensor {t.name}: data offset {t.rel_offset} is not a multiple of "
                                  f"general.alignment = {h.alignment} (tensor info at byte offset {t.info_offset})")
            start = h.data_offset + t.rel_offset
            if start + t.nbytes > h.size:
                raise FormatError(f"{h.path}: tensor {t.name}: data [{start}, {start + t.nbytes}) extends past the "
                                  f"end of the file ({h.size} bytes)")
            loc = TensorLocation(t.name, h.path, shard, start, t.nbytes, t.ggml_type, t.dims, t.info_offset)
            out[t.name] = loc
            spans.append(loc)
        spans.sort(key=lambda x: x.offset)
        for a, b in zip(spans, spans[1:]):
            if a.end > b.offset:
                raise FormatError(f"{h.path}: tensors {a.name} [{a.offset}, {a.end}) and {b.name} "
                                  f"[{b.offset}, {b.end}) overlap")
    return out


def _expect(tensors: Mapping[str, TensorLocation], name: str, gtype: GGMLQuantizationType,
            dims: Tuple[int, ...], path: Path, why: str) -> TensorLocation:
    loc = tensors.get(name)
    if loc is None:
        raise FormatError(f"{path}: required tensor {name} is missing ({why})")
    if loc.ggml_type != gtype:
        raise FormatError(f"{loc.path}: tensor {name} has type {loc.ggml_type.name}, expected {gtype.name} "
                          f"(tensor info at byte offset {loc.info_offset})")
    if loc.gguf_shape != dims:
        extra = ""
        if len(dims) == 2 and loc.gguf_shape == dims[::-1]:
            extra = " (transposed)"
        raise FormatError(f"{loc.path}: tensor {name} has GGUF shape {list(loc.gguf_shape)}{extra}, expected "
                          f"{list(dims)} ({why}; tensor info at byte offset {loc.info_offset})")
    return loc


# ================================================================ entry point
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
        Only headers are read: no tensor data, no memory map.

    Raises
    ------
    FormatError
        Naming the key, tensor, file and offset: a malformed or truncated header
        (wrong magic, version other than 3, absurd counts or lengths, unknown
        types); a missing shard or contradicting ``split.*`` keys; missing or
        mistyped Engram keys; a layout that breaks SPEC §2 (rows differing from the
        sum of the primes, even multipliers, ...); ``offsets``, ``head_count``,
        ``key_length`` or ``max_ngram_size`` contradicting the rest; token-map
        entries outside the compressed vocabulary; a missing Engram tensor or one
        of the wrong type or shape (``engram_embd`` I8 ``[264, rows]``,
        ``engram_kv`` F16 ``[6144, 25600]``, norms F32 ``[5120, 4]``, GGUF order);
        tensor data misaligned, overlapping, or past the end of its file; a
        path that is a directory, FIFO or device rather than a regular file.
    TableIOError
        Reading a header failed (``EIO`` and the like; names file and offset).
    ArgumentError
        ``path`` is neither a path nor a sequence of paths.
    """
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
    headers = _order_shards([_parse_header(p) for p in paths], from_names)
    first = headers[0]
    arch, enc, layout, token_map, eps, hidden = _engram_metadata(first)
    tensors = _locate(headers)
    ids = set(layout.layer_ids)
    for name, loc in tensors.items():
        mt = _ENGRAM_TENSOR_RE.match(name)
        if mt and int(mt.group(1)) not in ids:
            raise FormatError(f"{loc.path}: tensor {name} belongs to layer {mt.group(1)}, which is not in "
                              f"{arch}.engram.layer_ids {list(layout.layer_ids)}")
    layers: Dict[int, EngramLayer] = {}
    tables: Dict[int, TableLocation] = {}
    width = layout.columns * ROW_VALUES
    for li, lid in enumerate(layout.layer_ids):
        rows = int(layout.rows[li])
        pre = f"blk.{lid}."
        embd = _expect(tensors, pre + "engram_embd.weight", GGMLQuantizationType.I8, (ROW_BYTES, rows), first.path,
                       f"{rows} rows of {ROW_BYTES} bytes from {arch}.engram.rows")
        kv = _expect(tensors, pre + "engram_kv.weight", GGMLQuantizationType.F16,
                     (width, (HC_STREAMS + 1) * hidden), first.path,
                     f"{layout.columns} columns x {ROW_VALUES} values -> {HC_STREAMS} keys + 1 value of {hidden}")
        qn = _expect(tensors, pre + "engram_q_norm.weight", GGMLQuantizationType.F32, (hidden, HC_STREAMS),
                     first.path, f"one RMSNorm weight of {hidden} per stream")
        kn = _expect(tensors, pre + "engram_k_norm.weight", GGMLQuantizationType.F32, (hidden, HC_STREAMS),
                     first.path, f"one RMSNorm weight of {hidden} per stream")
        table = TableLocation(lid, embd.path, embd.shard, embd.offset, rows, ROW_BYTES)
        tables[lid] = table
        layers[lid] = EngramLayer(lid, table, kv, qn, kn)
    return ModelInfo(
        paths=tuple(h.path for h in headers),
        file_sizes=tuple(h.size for h in headers),
        architecture=arch,
        version=first.version,
        alignment=first.alignment,
        encoding=enc,
        layout=layout,
        token_map=token_map,
        eps=eps,
        layers=layers,
        tables=tables,
        tensors=tensors,
        metadata=dict(first.kv),
        data_offsets=tuple(h.data_offset for h in headers),
    )
