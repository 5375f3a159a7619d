"""Model files for the GGUF tests: the real token map (built once), synthetic models, header patches.

Header-only models are written with ``Fill(tables="none", projections=False)``: every
tensor extent exists but is a hole, so a file of the real shape costs a few
hundred KB of disk and ~0.1 s.  Patched copies keep the header bytes and
recreate the holes with ``truncate`` (never copying the extents).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from engram import build_token_map, synth
from engram.gguf import read_model

#: Layout scale of the small test models: ~195k rows (~50 MB) a table.
SCALE = 0.0005


@functools.lru_cache(maxsize=1)
def token_map() -> np.ndarray:
    """The real compressed token map of the DeepSeek V4 tokenizer (built once per process)."""
    tm = build_token_map()
    tm.setflags(write=False)
    return tm


def plan(**kw) -> synth.ModelPlan:
    """A plan of a small V4.1 Flash model with the real token map."""
    if not kw.get("full_size"):
        kw.setdefault("scale", SCALE)
    kw.setdefault("token_map", token_map())
    return synth.plan_model(synth.ModelShape(**kw))


def write_header_only(p: synth.ModelPlan, path) -> List[Path]:
    """Write ``p`` with all tensor extents left as holes."""
    return synth.write_model(p, path, synth.Fill(tables="none", projections=False), progress=False)


def clone_patched(src, dst, patch: Callable[[bytearray], None], size: Optional[int] = None,
                  header_len: Optional[int] = None) -> Path:
    """Copy ``src``'s header into ``dst``, apply ``patch`` to it, and size ``dst`` like ``src`` (holes)."""
    src, dst = Path(src), Path(dst)
    n = header_len if header_len is not None else read_model([src]).data_offsets[0]
    with open(src, "rb") as f:
        head = bytearray(f.read(n))
    patch(head)
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(os.stat(src).st_size if size is None else size)
    return dst
