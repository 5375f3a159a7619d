"""Split sets: the shards of a model named ``NAME-0000k-of-0000N.gguf`` and their ``split.*`` keys (SPEC §6).

llama.cpp's ``gguf-split`` writes the metadata into the first shard and gives
every shard ``split.no`` (0-based), ``split.count`` and, in the first,
``split.tensors.count``.  :func:`shard_paths` finds the siblings of one shard;
:func:`order_shards` orders parsed headers by ``split.no`` and checks the keys
against each other, the file names and the tensors the shards hold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import FormatError
from .header import INT_TYPES, Header, PathLike

__all__ = ["shard_paths", "order_shards", "shard_name"]

SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_name(path: PathLike, no: int, count: int) -> Path:
    """File name of shard ``no`` (1-based) of ``count`` for a model written to ``path`` (``gguf``'s naming)."""
    p = Path(path)
    return p.with_name(f"{p.stem}-{no:05d}-of-{count:05d}.gguf")


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
    m = SHARD_RE.match(p.name)
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


def _split_int(h: Header, key: str) -> Optional[int]:
    kv = h.kv.get(key)
    if kv is None:
        return None
    if kv.type not in INT_TYPES:
        raise FormatError(f"{h.path}: {key} has type {kv.describe_type()}, expected an integer "
                          f"(byte offset {kv.offset})")
    return int(kv.value)


def order_shards(headers: List[Header], from_names: bool) -> List[Header]:
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
    by_no: Dict[int, Header] = {}
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

