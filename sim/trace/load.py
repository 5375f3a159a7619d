"""``load_trace``: any source spec (text, prompts, tokens, a saved trace) made into a :class:`Trace`."""

from __future__ import annotations

from typing import Optional

from engram import Layout
from engram.errors import ArgumentError

from sim.core.io import read_text
from .base import Trace
from .sources import read_token_file, resolve_source
from .synth import synthesize_spec

__all__ = ["load_trace"]


def load_trace(spec: str, *, limit: Optional[int] = None, layout: Optional[Layout] = None,
               tokenizer_json: Optional[str] = None) -> Trace:
    """Build (or load) the trace named by ``spec`` (see :func:`resolve_source`).

    Parameters
    ----------
    spec : str
        A source spec: ``stdlib:...``, ``package:...``, ``shared:...``,
        ``text:...``, ``tokens:PATH``, ``synth:reuse=R,...`` or a path (``.jsonl``,
        ``.npz``, ``.npy``, text).
    limit : int, optional
        Keep only the first ``limit`` tokens (a synthetic trace is made that long,
        so that it still hits its reuse rate).
    layout : Layout, optional
        Default ``Layout.deepseek_v41_flash()`` (ignored for saved ``.npz`` traces).

    Raises
    ------
    ArgumentError, FormatError, TokenError
        Unknown source, unreadable file, token ids outside the vocabulary, or a source without tokens (an
        empty trace).
    """
    if limit is not None and limit < 1:
        raise ArgumentError(f"limit must be >= 1, got {limit}")
    tr = _build(spec, limit, layout, tokenizer_json)
    if tr.steps == 0:
        raise ArgumentError(f"the trace {spec!r} is empty: its source has no tokens")
    return tr


def _build(spec: str, limit: Optional[int], layout: Optional[Layout], tokenizer_json: Optional[str]) -> Trace:
    kind, what = resolve_source(spec)
    if kind == "synth":
        return synthesize_spec(str(what), limit=limit, layout=layout, tokenizer_json=tokenizer_json)
    if kind == "text":
        return Trace.from_text(what, layout=layout, tokenizer_json=tokenizer_json, limit=limit, source="text")
    if kind == "textfile":
        text = read_text(what, "text")
        return Trace.from_text(text, layout=layout, tokenizer_json=tokenizer_json, limit=limit, source=spec)
    if kind == "prompts":
        return Trace.from_prompts(what, layout=layout, tokenizer_json=tokenizer_json, limit=limit, source=spec)
    if kind == "tokens":
        ids = read_token_file(what)
        if limit is not None:
            ids = ids[:limit]
        return Trace.from_tokens(ids, layout=layout, tokenizer_json=tokenizer_json, source=spec)
    tr = Trace.load(what)
    return tr if limit is None else tr.head(limit)
