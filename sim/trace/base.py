"""The trace: the row ids every decode step reads, made from token ids by the real hash (SPEC §4, §9).

A :class:`Trace` holds the row ids of every step, ``uint32 [T, layers, columns]``
(``[T, 2, 24]`` for V4.1 Flash), made from real text through the real DeepSeek
V4 tokenizer, the compressed token map and :class:`engram.Hasher`.  A trace may
hold several sequences (one per prompt of a JSONL file); each starts from a
fresh hash history and, for the reuse statistics, a fresh session.
"""

from __future__ import annotations

import functools
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from engram import Hasher, Layout
from engram.errors import ArgumentError, FormatError, TokenError

from .sources import read_prompts
from .tokens import encode_text, tokenizer_and_map
from .wrap import WrapInfo, wrap_info

__all__ = ["Trace", "default_layout"]


# ----------------------------------------------------------------------- trace
@dataclass(eq=False)
class Trace:
    """Row ids of every decode step of one or more token sequences (SPEC §4).

    Attributes
    ----------
    rows : numpy.ndarray
        uint32 ``[T, layers, columns]``: global row ids within each layer's table,
        in ``[token][layer][column]`` order (``[T, 2, 24]`` for V4.1 Flash).
    tokens : numpy.ndarray
        int64 ``[T]``: the token ids (or compressed ids when built from those).
    starts : numpy.ndarray
        int64 ``[S]``: first step of each sequence; ``starts[0] == 0``, increasing.
    layer_ids : tuple of int
        Decoder layer of each table, e.g. ``(1, 14)``.
    heads : int
        Heads per n-gram order; column ``c`` has order ``c // heads + 2``.
    source : str
        Where the text came from (a source spec or a description).
    names : tuple of str
        One name per sequence (the prompt ids of a JSONL file).
    """

    rows: np.ndarray
    tokens: np.ndarray
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    layer_ids: tuple = (1, 14)
    heads: int = 8
    source: str = ""
    names: tuple = ()

    def __post_init__(self) -> None:
        rows = np.asarray(self.rows)
        if rows.ndim != 3 or rows.dtype != np.uint32:
            raise ArgumentError(f"Trace.rows must be uint32 [T, layers, columns], got {rows.dtype} {rows.shape}")
        T = rows.shape[0]
        tokens = np.asarray(self.tokens, dtype=np.int64)
        if tokens.shape != (T,):
            raise ArgumentError(f"Trace.tokens must have shape ({T},), got {tokens.shape}")
        starts = np.asarray(self.starts, dtype=np.int64).reshape(-1)
        if starts.size == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) or (T and starts[-1] >= T) \
                or (T == 0 and starts.size > 1):
            raise ArgumentError(f"Trace.starts must start at 0 and increase strictly below {T}, got {starts[:8]}")
        if rows.shape[1] < 1 or rows.shape[2] < 1:
            raise ArgumentError(f"Trace.rows must have at least one layer and one column, got shape {rows.shape}")
        layer_ids = tuple(self.layer_ids)
        for x in layer_ids:  # a key is (layer id << 32) | row: a layer id is a uint32, and names one table
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or not 0 <= x < 2**32:
                raise ArgumentError(f"Trace.layer_ids must be integers in [0, 2**32), got {x!r} in "
                                    f"{list(layer_ids)[:8]}")
        layer_ids = tuple(int(x) for x in layer_ids)
        if len(set(layer_ids)) != len(layer_ids):
            dup = next(x for x in layer_ids if layer_ids.count(x) > 1)
            raise ArgumentError(f"Trace.layer_ids names layer {dup} twice ({list(layer_ids)[:8]}): each layer is "
                                f"one table, and the keys (layer, row) of two would collide")
        if len(layer_ids) != rows.shape[1]:
            raise ArgumentError(f"Trace.layer_ids has {len(layer_ids)} layers, rows have {rows.shape[1]}")
        if isinstance(self.heads, (bool, np.bool_)) or not isinstance(self.heads, (int, np.integer)):
            raise ArgumentError(f"Trace.heads must be an integer, got {type(self.heads).__name__} {self.heads!r}")
        if self.heads < 1 or rows.shape[2] % self.heads:
            raise ArgumentError(f"Trace.heads = {self.heads} does not divide {rows.shape[2]} columns")
        self.heads = int(self.heads)
        names = tuple(str(x) for x in self.names) or tuple(f"seq{i}" for i in range(starts.size))
        if len(names) != starts.size:
            raise ArgumentError(f"Trace.names has {len(names)} names for {starts.size} sequences")
        self.rows, self.tokens, self.starts = np.ascontiguousarray(rows), tokens, starts
        self.layer_ids, self.names = layer_ids, names

    # --------------------------------------------------------------- shape
    @property
    def steps(self) -> int:
        """Number of steps (tokens) ``T``."""
        return int(self.rows.shape[0])

    @property
    def layers(self) -> int:
        return int(self.rows.shape[1])

    @property
    def columns(self) -> int:
        return int(self.rows.shape[2])

    @property
    def orders(self) -> np.ndarray:
        """int ``[columns]``: n-gram order of each column (``c // heads + 2``)."""
        return np.arange(self.columns) // self.heads + 2

    def sequence_ids(self) -> np.ndarray:
        """int64 ``[T]``: index of the sequence each step belongs to."""
        seq = np.zeros(self.steps, dtype=np.int64)
        if self.starts.size > 1:
            seq[self.starts[1:]] = 1
            seq = np.cumsum(seq)
        return seq

    def wraps(self, steps: int, sessions: int = 1) -> WrapInfo:
        """Whether ``sessions`` sessions of ``steps`` steps each read past the end of this trace.

        Sessions start where :func:`sim.decode.session_reads` starts them
        (:func:`sim.trace.wrap.session_offsets`); see :class:`~sim.trace.wrap.WrapInfo`
        (``.wraps``: a session replays its own steps; ``.overlaps``: sessions read
        the same steps; ``.warning()``: the sentence to print).

        Raises
        ------
        ArgumentError
            The trace has no steps, or ``steps`` or ``sessions`` is below 1.
        """
        if self.steps == 0:
            raise ArgumentError("the trace has no steps")
        return wrap_info(self.steps, steps, sessions)

    def head(self, n: int) -> "Trace":
        """The first ``n`` steps (all of them when ``n >= T``)."""
        if n < 0:
            raise ArgumentError(f"head: n must be >= 0, got {n}")
        n = min(int(n), self.steps)
        keep = self.starts[self.starts < max(n, 1)]
        return Trace(self.rows[:n], self.tokens[:n], keep, self.layer_ids, self.heads, self.source,
                     self.names[: keep.size])

    def __repr__(self) -> str:
        return (f"Trace(source={self.source!r}, steps={self.steps}, sequences={self.starts.size}, "
                f"shape={tuple(self.rows.shape)})")

    # ---------------------------------------------------------- building
    @classmethod
    def from_tokens(cls, tokens, *, layout: Optional[Layout] = None, compressed: bool = False,
                    tokenizer_json: Optional[str] = None, starts: Optional[Sequence[int]] = None,
                    names: Sequence[str] = (), source: str = "tokens") -> "Trace":
        """Hash token ids into a trace.

        Parameters
        ----------
        tokens : array_like of int, shape ``[T]``
            Token ids of the DeepSeek V4 tokenizer, or compressed ids when
            ``compressed`` is true.
        layout : Layout, optional
            Default ``Layout.deepseek_v41_flash()``.
        starts : sequence of int, optional
            First step of each sequence; the hash history restarts at each.
            Default: one sequence.

        Raises
        ------
        TokenError
            A token id is outside the vocabulary (the message names its position).
        """
        layout = layout if layout is not None else default_layout()
        if compressed:
            hasher = Hasher(layout)
        else:
            hasher = Hasher(layout, tokenizer_and_map(tokenizer_json)[1])
        tok = np.asarray(tokens)
        if tok.ndim != 1:
            raise TokenError(f"tokens must be 1-D, got shape {tok.shape}")
        st = np.asarray([0] if starts is None else list(starts), dtype=np.int64)
        bounds = list(st) + [tok.shape[0]]
        rows = np.empty((tok.shape[0], layout.layers, layout.columns), dtype=np.uint32)
        for a, b in zip(bounds[:-1], bounds[1:]):
            rows[a:b] = hasher.hash(tok[a:b])
        return cls(rows, tok.astype(np.int64), st, layout.layer_ids, layout.heads, source, tuple(names))

    @classmethod
    def from_text(cls, text: str, *, layout: Optional[Layout] = None, tokenizer_json: Optional[str] = None,
                  limit: Optional[int] = None, source: str = "text") -> "Trace":
        """Tokenize ``text`` with the DeepSeek V4 tokenizer (no special tokens) and hash it.

        ``limit`` keeps the first ``limit`` tokens.
        """
        ids = encode_text(text, tokenizer_json, limit)
        return cls.from_tokens(ids, layout=layout, tokenizer_json=tokenizer_json, source=source)

    @classmethod
    def from_prompts(cls, path: Union[str, os.PathLike], *, layout: Optional[Layout] = None,
                     tokenizer_json: Optional[str] = None, limit: Optional[int] = None,
                     source: Optional[str] = None) -> "Trace":
        """One sequence per prompt of a JSONL file (``{"id": ..., "prompt": ...}`` a line).

        Each prompt is hashed from a fresh history.  ``limit`` caps the total
        number of tokens (the last sequence is cut).

        Raises
        ------
        FormatError
            A line is not a JSON object with a string ``prompt`` (names the line).
        """
        prompts = read_prompts(path)
        tok, _ = tokenizer_and_map(tokenizer_json)
        ids_list, names, starts, total = [], [], [], 0
        for pid, text in prompts:
            ids = tok.encode(text, add_special_tokens=False).ids
            if limit is not None:
                ids = ids[: max(0, limit - total)]
            if not ids:
                continue
            starts.append(total)
            names.append(pid)
            ids_list.append(np.asarray(ids, dtype=np.int64))
            total += len(ids)
            if limit is not None and total >= limit:
                break
        if not ids_list:
            raise FormatError(f"{path}: no prompt with any token")
        return cls.from_tokens(np.concatenate(ids_list), layout=layout, tokenizer_json=tokenizer_json,
                               starts=starts, names=names, source=source or str(path))

    # ------------------------------------------------------- persistence
    def save(self, path: Union[str, os.PathLike]) -> Path:
        """Write the trace as a compressed ``.npz`` file and return its path."""
        path = Path(path)
        np.savez_compressed(path, rows=self.rows, tokens=self.tokens, starts=self.starts,
                            layer_ids=np.asarray(self.layer_ids, dtype=np.int64),
                            heads=np.int64(self.heads), source=np.str_(self.source),
                            names=np.asarray(self.names, dtype=np.str_))
        return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Trace":
        """Read a trace written by :meth:`save`.

        Raises
        ------
        FormatError
            The file is missing a field, a field has the wrong type or value (``layer_ids`` not distinct integers
            in ``[0, 2**32)``, ``heads`` not one integer that divides the columns, ``rows`` with no layer or
            column), or the fields disagree (names the field).
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                if not hasattr(z, "files"):
                    raise FormatError(f"{path}: not a trace file (an .npy array, not an .npz archive)")
                need = ("rows", "tokens", "starts", "layer_ids", "heads", "source", "names")
                missing = [k for k in need if k not in z.files]
                if missing:
                    raise FormatError(f"{path}: not a trace file, missing field {missing[0]!r}")
                lids, heads = z["layer_ids"], z["heads"]
                if lids.ndim != 1 or lids.dtype.kind not in "iu":
                    raise FormatError(f"{path}: field 'layer_ids' must be integers [layers], got {lids.dtype} "
                                      f"{lids.shape}")
                if heads.ndim != 0 or heads.dtype.kind not in "iu":
                    raise FormatError(f"{path}: field 'heads' must be one integer, got {heads.dtype} {heads.shape}"
                                      + (f" {heads.tolist()}" if heads.size <= 4 else ""))
                tr = cls(z["rows"], z["tokens"], z["starts"], tuple(lids.tolist()), heads.item(),
                         str(z["source"]), tuple(str(x) for x in z["names"]))
        except FormatError:
            raise
        except ArgumentError as exc:
            raise FormatError(f"{path}: {exc}") from None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            raise FormatError(f"{path}: cannot read trace ({exc.__class__.__name__}: {exc})") from None
        tr.check_rows(default_layout(), str(path))
        return tr

    def check_rows(self, layout: Layout, where: str) -> None:
        """Refuse row ids beyond their table: ``rows[:, l, :] < layout.rows[l]`` when the trace has the
        layout's tables (its layer ids and columns); a trace of another shape is checked against the largest
        table of ``layout``.

        Raises
        ------
        FormatError
            The first row id beyond its table (names the step, layer, column, the row id and the table size).
        """
        same = self.layer_ids == tuple(int(x) for x in layout.layer_ids) and self.columns == int(layout.columns)
        sizes = np.asarray(layout.rows, dtype=np.int64)
        limit = sizes[None, :, None] if same else np.int64(sizes.max())
        bad = self.rows.astype(np.int64) >= limit
        if bad.any():
            t, li, c = (int(x) for x in np.argwhere(bad)[0])
            size = int(sizes[li] if same else sizes.max())
            raise FormatError(f"{where}: step {t}, layer {self.layer_ids[li]}, column {c}: row {int(self.rows[t, li, c])} "
                              f"is beyond its table ({size} rows)")


@functools.lru_cache(maxsize=1)
def default_layout() -> Layout:
    return Layout.deepseek_v41_flash()
