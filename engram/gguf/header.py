"""Bounded parsing of GGUF headers: the fixed header, the metadata (key/value) section and the
tensor infos of one file, read with small ``pread`` calls and never a memory map.

``gguf.GGUFReader`` memory-maps the whole file and builds a numpy view per
field, which is what an Engram table (about 94 GiB, possibly a sparse extent
full of holes) must not be subjected to, so the parser here is a small one of
its own that uses the ``gguf`` package's constants (``GGUF_MAGIC``,
``GGUFValueType``, ``GGMLQuantizationType``, ``GGML_QUANT_SIZES``).  Every count
read from a header (string and array lengths, key and tensor counts,
dimensions) is checked against the bytes left in the file and against a fixed
limit *before* anything is allocated, so a malformed or hostile header cannot
drive a large allocation.  Errors are :class:`~engram.errors.FormatError`
naming the file, the key or tensor and the byte offset.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from ..errors import FormatError, TableIOError

__all__ = [
    "GGUF_VERSION", "KeyValue", "TensorInfo", "Header", "Cursor", "parse_header", "read_kv", "load_array",
    "load_strings", "strings_digest", "digest_of_strings", "open_regular", "close_quietly", "pad", "INT_TYPES",
    "FLOAT_TYPES", "MAX_STRINGS_BYTES",
]

PathLike = Union[str, os.PathLike]

#: The GGUF version this parser reads.
GGUF_VERSION = 3
#: Bytes of the fixed GGUF header: magic (4), version (uint32), tensor count and key count (uint64 each).
FIXED_HEADER_BYTES = 24

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
#: Most bytes of a string array loaded or digested (:func:`load_strings`, :func:`strings_digest`); a
#: vocabulary of 129,280 tokens takes 2.3 MB, its 127,741 merges 2.4 MB.
MAX_STRINGS_BYTES = 256 << 20
MAX_ALIGNMENT = 1 << 30

_READ_BLOCK = 1 << 16

SCALAR_DTYPES = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}
INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})

#: Our own module-level alias, so tests can watch every byte range the parser reads.
_pread = os.pread


def pad(x: int, n: int) -> int:
    """``x`` rounded up to a multiple of ``n``."""
    return ((x + n - 1) // n) * n


def close_quietly(fd: int) -> None:
    """Close ``fd``, dropping an error from close(2) (EIO, ENOTCONN from a FUSE server that is
    gone): Linux releases the descriptor anyway, and the caller's own error must not be masked."""
    try:
        os.close(fd)
    except OSError:
        pass


def open_regular(path: Path) -> int:
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
        close_quietly(fd)
        raise
    return fd


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry of a GGUF header.

    ``value`` is a Python scalar or ``str`` for scalar types, a read-only numpy
    array for numeric arrays of at most :data:`INLINE_ARRAY_ELEMENTS` elements
    (or longer ones the Engram metadata needed, such as the token map), and
    ``None`` for arrays only located (other long numeric arrays, arrays of
    strings, nested arrays); ``count`` is the array length (``None`` for
    scalars).  ``offset`` is the byte offset of the entry (its key) in ``path``;
    ``data_offset`` that of the first element of a numeric or string array
    (-1 otherwise), and ``data_nbytes`` the bytes of its elements as the file
    stores them (a string: its uint64 length, then its UTF-8 bytes).
    """

    key: str
    type: GGUFValueType
    value: Any
    offset: int
    path: Path
    subtype: Optional[GGUFValueType] = None
    count: Optional[int] = None
    data_offset: int = -1
    data_nbytes: int = -1

    def describe_type(self) -> str:
        if self.type == GGUFValueType.ARRAY:
            return f"ARRAY[{self.subtype.name if self.subtype is not None else '?'}]"
        return self.type.name


# ================================================================ bounded reader
class Cursor:
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


# ================================================================ header parsing
@dataclass
class TensorInfo:
    """One tensor info record: dimensions in GGUF order, data offset relative to the data section."""

    name: str
    dims: Tuple[int, ...]
    ggml_type: GGMLQuantizationType
    rel_offset: int
    nbytes: int
    info_offset: int


@dataclass
class Header:
    """What :func:`parse_header` read from one file; ``data_offset`` is where its data section begins."""

    path: Path
    size: int
    version: int
    kv: Dict[str, KeyValue]
    tensors: List[TensorInfo]
    alignment: int
    data_offset: int


def _value_type(cur: Cursor, raw: int, what: str, at: int) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what}: unknown value type {raw}", at) from None


def _skip_strings(cur: Cursor, count: int, key: str) -> None:
    """Walk ``count`` strings (each checked against :data:`MAX_STRING_BYTES` and the file) without keeping them."""
    unpack = struct.Struct("<Q").unpack_from
    for i in range(count):
        at = cur.pos
        start = at - cur._buf_start
        if 0 <= start and start + 8 <= len(cur._buf):  # the length lies in the buffer: no call per string
            n = unpack(cur._buf, start)[0]
            cur.pos += 8
        else:
            n = cur.u64(f"length of {key}[{i}]")
        if n > MAX_STRING_BYTES or n > cur.size - cur.pos:
            raise cur.fail(f"{key}[{i}]: string length {n} exceeds the limit or the file", at)
        cur.pos += n


def _read_value(cur: Cursor, vtype: GGUFValueType, key: str, depth: int = 0):
    """Read (or skip) one value; returns ``(value, subtype, count, data_offset, data_nbytes)``."""
    fmt = SCALAR_DTYPES.get(vtype)
    if fmt is not None:
        raw = cur.take(np.dtype(fmt).itemsize, key)
        v = np.frombuffer(raw, dtype=fmt)[0]
        if vtype == GGUFValueType.BOOL:
            return bool(v), None, None, -1, -1
        return (float(v) if vtype in FLOAT_TYPES else int(v)), None, None, -1, -1
    if vtype == GGUFValueType.STRING:
        return cur.string(key, MAX_STRING_BYTES), None, None, -1, -1
    if vtype == GGUFValueType.ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise cur.fail(f"{key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        at = cur.pos
        sub = _value_type(cur, cur.u32(f"{key} element type"), key, at)
        at = cur.pos
        count = cur.u64(f"{key} length")
        if count > MAX_ARRAY_ELEMENTS:
            raise cur.fail(f"{key}: array length {count} exceeds the limit of {MAX_ARRAY_ELEMENTS}", at)
        fmt = SCALAR_DTYPES.get(sub)
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
                return arr, sub, count, at, nbytes
            cur.skip(nbytes, key)
            return None, sub, count, at, nbytes
        if sub == GGUFValueType.STRING:
            at = cur.pos
            _skip_strings(cur, count, key)
            return None, sub, count, at, cur.pos - at
        for i in range(count):  # nested arrays: walk and drop
            _read_value(cur, sub, f"{key}[{i}]", depth + 1)
        return None, sub, count, -1, -1
    raise cur.fail(f"{key}: unknown value type {vtype}")  # pragma: no cover - GGUFValueType is closed


def _as_array(raw: bytes, fmt: str, sub: GGUFValueType) -> np.ndarray:
    arr = np.frombuffer(raw, dtype=fmt)
    if sub == GGUFValueType.BOOL:
        arr = arr.astype(bool)
    arr.setflags(write=False)
    return arr


def load_array(kv: KeyValue) -> np.ndarray:
    """Read a numeric array that parsing only located (bounds were checked then)."""
    fmt = SCALAR_DTYPES[kv.subtype]
    return _as_array(_read_located(kv, kv.count * np.dtype(fmt).itemsize), fmt, kv.subtype)


def _read_located(kv: KeyValue, nbytes: int) -> bytes:
    """The ``nbytes`` stored at ``kv``'s data offset, located (and bounds-checked) when parsing.

    Raises
    ------
    TableIOError
        The file cannot be opened again.
    FormatError
        The file is shorter now than when it was parsed.
    """
    try:
        fd = open_regular(kv.path)
    except OSError as exc:
        raise TableIOError(f"{kv.path}: cannot open to read {kv.key}: {exc.strerror}", errno_=exc.errno) from None
    try:
        cur = Cursor(fd, os.fstat(fd).st_size, kv.path)
        cur.pos = kv.data_offset
        return cur.take(nbytes, kv.key)
    finally:
        close_quietly(fd)


def _string_array_bytes(kv: KeyValue) -> bytes:
    """The stored bytes of string array ``kv`` (located when parsing, so their bounds were checked then)."""
    if kv.type != GGUFValueType.ARRAY or kv.subtype != GGUFValueType.STRING or kv.data_offset < 0:
        raise FormatError(f"{kv.path}: {kv.key}: has type {kv.describe_type()}, expected ARRAY[STRING] "
                          f"(byte offset {kv.offset})")
    if kv.data_nbytes > MAX_STRINGS_BYTES:
        raise FormatError(f"{kv.path}: {kv.key}: {kv.data_nbytes} bytes of strings exceed the limit of "
                          f"{MAX_STRINGS_BYTES} (byte offset {kv.offset})")
    return _read_located(kv, kv.data_nbytes)


def load_strings(kv: KeyValue) -> List[str]:
    """The strings of a string array that parsing located (``tokenizer.ggml.tokens``, ``tokenizer.ggml.merges``).

    One read of the array's stored bytes (at most :data:`MAX_STRINGS_BYTES`),
    then each string decoded: 129,280 tokens in about 30 ms.

    Raises
    ------
    FormatError
        ``kv`` is not a string array, is too long, changed since parsing, or
        holds a string that is not UTF-8 (names the entry and its byte offset).
    TableIOError
        The read failed.
    """
    raw = _string_array_bytes(kv)
    unpack = struct.Struct("<Q").unpack_from
    out: List[str] = []
    pos = 0
    for i in range(kv.count):
        if pos + 8 > len(raw):
            raise FormatError(f"{kv.path}: {kv.key}[{i}]: the array changed since its header was read "
                              f"(byte offset {kv.data_offset + pos})")
        n = unpack(raw, pos)[0]
        pos += 8
        if pos + n > len(raw):
            raise FormatError(f"{kv.path}: {kv.key}[{i}]: the array changed since its header was read "
                              f"(byte offset {kv.data_offset + pos - 8})")
        try:
            out.append(raw[pos:pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise FormatError(f"{kv.path}: {kv.key}[{i}]: string is not valid UTF-8 "
                              f"(byte offset {kv.data_offset + pos - 8})") from None
        pos += n
    return out


def strings_digest(kv: KeyValue) -> str:
    """SHA-256 (hex) of a string array's stored bytes: equal to :func:`digest_of_strings` of its strings.

    One read of at most :data:`MAX_STRINGS_BYTES` (2.3 MB for a 129,280-token
    vocabulary, a few ms).  Raises as :func:`load_strings`.
    """
    return hashlib.sha256(_string_array_bytes(kv)).hexdigest()


def digest_of_strings(strings) -> str:
    """SHA-256 (hex) of ``strings`` stored as a GGUF string array's elements (uint64 length, UTF-8 bytes each)."""
    h = hashlib.sha256()
    pack = struct.Struct("<Q").pack
    for s in strings:
        b = s.encode("utf-8")
        h.update(pack(len(b)))
        h.update(b)
    return h.hexdigest()


def _fixed_header(cur: Cursor) -> Tuple[int, int, int]:
    """Magic, version and the two counts (checked against the bytes left): ``(version, n_tensors, n_kv)``."""
    path, size = cur.path, cur.size
    magic_raw = cur.take(4, "magic") if size >= 4 else None
    if magic_raw is not None and struct.unpack("<I", magic_raw)[0] != GGUF_MAGIC:
        raise FormatError(f"{path}: not a GGUF file: magic {magic_raw!r} at byte offset 0, expected b'GGUF'")
    if size < FIXED_HEADER_BYTES:
        raise FormatError(f"{path}: not a GGUF file: too short to hold a GGUF header ({size} "
                          f"byte{'' if size == 1 else 's'}; the fixed header alone needs {FIXED_HEADER_BYTES}: "
                          f"magic, version, tensor count, key count)")
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
    return version, n_tensors, n_kv


def _metadata(cur: Cursor, n_kv: int) -> Dict[str, KeyValue]:
    """The ``n_kv`` key/value entries, in file order."""
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
        value, sub, count, data_at, data_nbytes = _read_value(cur, vtype, key)
        kv[key] = KeyValue(key, vtype, value, at, cur.path, sub, count, data_at, data_nbytes)
    return kv


def _alignment(path: Path, kv: Dict[str, KeyValue]) -> int:
    """``general.alignment`` (a power of two), or the GGUF default of 32."""
    a = kv.get("general.alignment")
    if a is None:
        return GGUF_DEFAULT_ALIGNMENT
    if a.type not in INT_TYPES:
        raise FormatError(f"{path}: general.alignment has type {a.describe_type()}, expected UINT32 "
                          f"(byte offset {a.offset})")
    alignment = int(a.value)
    if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
        raise FormatError(f"{path}: general.alignment = {alignment} is not a power of two "
                          f"<= {MAX_ALIGNMENT} (byte offset {a.offset})")
    return alignment


def _tensor_info(cur: Cursor, i: int) -> TensorInfo:
    """Tensor info record number ``i``: name, dimensions, type, relative offset."""
    at = cur.pos
    name = cur.string(f"tensor #{i} name", MAX_NAME_BYTES)
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
    return TensorInfo(name, tuple(int(d) for d in dims), gtype, rel, nbytes, at)


def _tensor_infos(cur: Cursor, n_tensors: int) -> List[TensorInfo]:
    tensors: List[TensorInfo] = []
    first: Dict[str, int] = {}
    for i in range(n_tensors):
        t = _tensor_info(cur, i)
        if t.name in first:
            raise cur.fail(f"duplicate tensor {t.name!r} (first info at byte offset {first[t.name]})", t.info_offset)
        first[t.name] = t.info_offset
        tensors.append(t)
    return tensors


def parse_header(path: Path) -> Header:
    """Parse the header of the GGUF file ``path`` with bounded reads.

    Raises
    ------
    FormatError
        Not a regular file, missing, or a malformed header (names the key or
        tensor and the byte offset).
    TableIOError
        A read failed (``EIO`` and the like).
    """
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such model file") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot open ({exc.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        cur = Cursor(fd, size, path)
        version, n_tensors, n_kv = _fixed_header(cur)
        kv = _metadata(cur, n_kv)
        alignment = _alignment(path, kv)
        tensors = _tensor_infos(cur, n_tensors)
        return Header(path, size, version, kv, tensors, alignment, pad(cur.pos, alignment))
    finally:
        close_quietly(fd)


def read_kv(path: PathLike) -> Dict[str, KeyValue]:
    """The metadata entries of one GGUF file, read with bounded reads (no tensor data).

    Raises
    ------
    FormatError
        The header is malformed (names the key or offset).
    """
    return parse_header(Path(path)).kv

