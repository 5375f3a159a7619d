"""Where the tensors of a model lie: every tensor's file, absolute offset, type and shape (SPEC §6).

:func:`locate` turns the tensor infos of every shard into absolute
:class:`TensorLocation` records, rejecting data that is misaligned, overlaps
or runs past the end of its file; :func:`expect_tensor` checks one Engram
tensor's type and shape; :func:`read_tensor_data` reads a small tensor (never
a table) with ``preadv``; :func:`check_finite` refuses a weight tensor holding
a NaN or an infinity, naming where.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
from gguf import GGMLQuantizationType

from ..codec import ROW_BYTES
from ..errors import ArgumentError, FormatError, TableIOError
from .header import Header, close_quietly, open_regular

__all__ = ["TensorLocation", "TableLocation", "EngramLayer", "locate", "expect_tensor", "read_tensor_data",
           "check_finite", "engram_layer_ids"]

#: Rows of a weight tensor :func:`check_finite` looks at a block (bounds its temporary to a few MB).
FINITE_BLOCK_ROWS = 512
#: Exponent bits of an IEEE 754 float by its size in bytes, in the unsigned integer of that size.
_EXPONENT_BITS = {2: np.uint16(0x7C00), 4: np.uint32(0x7F800000), 8: np.uint64(0x7FF0000000000000)}

_NUMPY_OF_GGML = {
    GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"), GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"), GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}

#: ``blk.L.engram_*.weight``: an Engram tensor of decoder layer ``L``.
ENGRAM_TENSOR_RE = re.compile(r"^blk\.(\d+)\.engram_[A-Za-z0-9_]+\.weight$")
#: ``blk.L.engram_embd.weight``: the table of layer ``L``.
TABLE_TENSOR_RE = re.compile(r"^blk\.(\d+)\.engram_embd\.weight$")


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


def engram_layer_ids(headers: List[Header]) -> List[int]:
    """Layers that hold a table tensor ``blk.L.engram_embd.weight``, in increasing order."""
    ids = set()
    for h in headers:
        for t in h.tensors:
            m = TABLE_TENSOR_RE.match(t.name)
            if m:
                ids.add(int(m.group(1)))
    return sorted(ids)


def locate(headers: List[Header]) -> Dict[str, TensorLocation]:
    """Every tensor of every shard by name, at its absolute offset.

    Raises ``FormatError`` for a name in two shards, data not aligned to
    ``general.alignment``, data past the end of its file, or overlapping data.
    """
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


def expect_tensor(tensors: Mapping[str, TensorLocation], name: str, gtype: GGMLQuantizationType,
                  dims: Tuple[int, ...], path: Path, why: str) -> TensorLocation:
    """Tensor ``name``, which must exist with type ``gtype`` and GGUF shape ``dims``.

    ``why`` says where the expected shape comes from (named keys, or what was
    derived from what); it is part of every error message.
    """
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


def read_tensor_data(loc: TensorLocation, max_bytes: int) -> np.ndarray:
    """The data of tensor ``loc`` as a new array of its numpy dtype and shape (``preadv``, no map).

    Raises
    ------
    ArgumentError
        A block-quantized type, or more than ``max_bytes`` bytes.
    TableIOError
        The file cannot be opened, a read failed or came back short.
    """
    name = loc.name
    if loc.dtype is None:
        raise ArgumentError(f"{name}: type {loc.ggml_type.name} is block-quantized; not readable as an array")
    if loc.nbytes > max_bytes:
        raise ArgumentError(f"{name}: {loc.nbytes} bytes exceeds max_bytes={max_bytes}")
    out = np.empty(loc.shape, dtype=loc.dtype)
    buf = memoryview(out.reshape(-1).view(np.uint8))
    try:
        fd = open_regular(loc.path)
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
        close_quietly(fd)
    return out


def check_finite(loc: TensorLocation, data: np.ndarray) -> None:
    """Refuse weights holding a NaN or an infinity: ``data`` is tensor ``loc`` as read
    (:func:`read_tensor_data`: C-contiguous, any shape, either byte order; float16, float32 or float64 --
    other dtypes pass).

    The projection would carry such a value into every key and value of every
    token, and a gate weight into every gate, silently.  A value is non-finite
    when all its exponent bits are set (IEEE 754); the check masks them in the
    integer view, in blocks of :data:`FINITE_BLOCK_ROWS` rows (a temporary of a
    few MB): 12.7 ms for a 315 MB ``engram_kv`` on the 2-core development
    machine, against 163 ms for ``numpy.isfinite`` (which converts float16; ``benchmarks.run mixer --only
    weights``).

    Raises
    ------
    FormatError
        The first non-finite value in C order: its value, its index (row and
        column of a matrix), the tensor, file and byte offset of the value.
    ArgumentError
        ``data`` is not a C-contiguous numpy array (its file offsets would be wrong).
    """
    if not isinstance(data, np.ndarray) or isinstance(data, np.matrix) or not data.flags.c_contiguous:
        raise ArgumentError(f"{loc.name}: check_finite needs the tensor as read, a C-contiguous numpy array, got "
                            f"{type(data).__name__}" + (" (not C-contiguous)" if type(data) is np.ndarray else ""))
    mask = _EXPONENT_BITS.get(data.dtype.itemsize) if data.dtype.kind == "f" else None
    if mask is None or data.size == 0:
        return
    order = data.dtype.byteorder if data.dtype.byteorder in "<>" else "="
    bits = data.reshape(data.shape[0] if data.ndim > 1 else 1, -1).view(mask.dtype.newbyteorder(order))
    tmp = np.empty((min(FINITE_BLOCK_ROWS, bits.shape[0]), bits.shape[1]), mask.dtype)
    for r0 in range(0, bits.shape[0], FINITE_BLOCK_ROWS):
        block = bits[r0:r0 + FINITE_BLOCK_ROWS]
        part = tmp[:block.shape[0]]
        np.bitwise_and(block, mask, out=part)
        if part.max() == mask:
            i = r0 * bits.shape[1] + int(np.flatnonzero(part.reshape(-1) == mask)[0])
            index = tuple(int(x) for x in np.unravel_index(i, data.shape))
            where = (f"row {index[0]}, column {index[1]}" if data.ndim == 2 else
                     f"index {index[0]}" if data.ndim == 1 else f"index {index}")
            raise FormatError(f"{loc.path}: tensor {loc.name} holds {float(data.reshape(-1)[i])} at {where} (file "
                              f"offset {loc.offset + i * data.itemsize}); its weights must be finite")
