"""Token traces: real text -> the row ids each decode step reads, and their reuse (SPEC §4, §8, §9).

A :class:`Trace` holds the row ids of every step, ``uint32 [T, layers, columns]``
(``[T, 2, 24]`` for V4.1 Flash), made from real text through the real DeepSeek
V4 tokenizer, the compressed token map and :class:`engram.Hasher`.  A trace may
hold several sequences (one per prompt of a JSONL file); each starts from a
fresh hash history and, for the reuse statistics, a fresh session.

Sources are named by a short spec (see :func:`resolve_source`):

``stdlib:asyncio/base_events.py``
    a source file of Python's standard library (always present, no download);
``package:numpy/linalg/_linalg.py``
    a file inside an installed package;
``shared:promessi_sposi.txt``, ``shared:prompts.jsonl``
    the project's shared corpora in ``<repo>/../shared/data`` (or
    ``$ENGRAM_SHARED_DATA``);
``text:...``
    the literal text after the colon;
``tokens:PATH``
    token ids (whitespace/comma separated integers, or a ``.npy`` array);
a path
    ``.jsonl`` (prompts: one ``{"id", "prompt"}`` object a line), ``.npz`` (a
    saved trace), ``.npy`` (token ids), anything else is read as UTF-8 text.

Reuse statistics (:func:`reuse_stats`): the share of row reads whose
``(layer, row)`` was read earlier in the same session, by n-gram order and by
layer, and the hit rate of a least-recently-used row cache of a given size.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np
from tqdm import tqdm

from engram import Hasher, Layout, build_token_map, load_tokenizer
from engram.errors import ArgumentError, FormatError, TokenError

from .io import read_jsonl, shared_data_dir

__all__ = [
    "CODE_SOURCE",
    "ReuseStats",
    "Trace",
    "builtin_sources",
    "load_trace",
    "lru_hit_rate",
    "lru_hits",
    "repeat_mask",
    "resolve_source",
    "reuse_stats",
]

#: The built-in source-code trace: a large, plain module of the standard library.
CODE_SOURCE = "stdlib:asyncio/base_events.py"

def builtin_sources() -> dict[str, str]:
    """Named trace sources available on this machine, with a one-line description each."""
    out = {
        CODE_SOURCE: "Python standard library source (asyncio event loop), present with every Python",
        "stdlib:inspect.py": "Python standard library source (inspect module)",
    }
    data = shared_data_dir()
    for name, what in (("promessi_sposi.txt", "Italian novel, public domain"),
                       ("prompts.jsonl", "100 short prompts, one sequence each"),
                       ("agent_prompt_long.txt", "long system prompt of a coding agent (~37k tokens)")):
        if (data / name).is_file():
            out[f"shared:{name}"] = what
    return out


# ------------------------------------------------------------------- tokenizer
@functools.lru_cache(maxsize=4)
def _tokenizer_and_map(tokenizer_json: Optional[str]):
    return load_tokenizer(tokenizer_json), build_token_map(tokenizer_json)


def _encode(text: str, tokenizer_json: Optional[str], limit: Optional[int]) -> np.ndarray:
    """Token ids of ``text``; with ``limit`` only a prefix of the text is encoded when that is enough."""
    tok, _ = _tokenizer_and_map(tokenizer_json)
    if limit is not None:
        # Pre-tokenization splits at word boundaries, so the tokens of a long enough
        # prefix agree with those of the whole text except near the cut.
        n = max(64, limit * 8)
        while n < len(text):
            ids = tok.encode(text[:n], add_special_tokens=False).ids
            if len(ids) >= limit + 16:
                return np.asarray(ids[:limit], dtype=np.int64)
            n *= 2
    ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    return ids if limit is None else ids[:limit]


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
        layer_ids = tuple(int(x) for x in self.layer_ids)
        if len(layer_ids) != rows.shape[1]:
            raise ArgumentError(f"Trace.layer_ids has {len(layer_ids)} layers, rows have {rows.shape[1]}")
        if self.heads < 1 or rows.shape[2] % self.heads:
            raise ArgumentError(f"Trace.heads = {self.heads} does not divide {rows.shape[2]} columns")
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
        layout = layout if layout is not None else _default_layout()
        if compressed:
            hasher = Hasher(layout)
        else:
            hasher = Hasher(layout, _tokenizer_and_map(tokenizer_json)[1])
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
        ids = _encode(text, tokenizer_json, limit)
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
        tok, _ = _tokenizer_and_map(tokenizer_json)
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
            The file is missing a field or the fields disagree (names the field).
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                need = ("rows", "tokens", "starts", "layer_ids", "heads", "source", "names")
                missing = [k for k in need if k not in z.files]
                if missing:
                    raise FormatError(f"{path}: not a trace file, missing field {missing[0]!r}")
                return cls(z["rows"], z["tokens"], z["starts"], tuple(int(x) for x in z["layer_ids"]),
                           int(z["heads"]), str(z["source"]), tuple(str(x) for x in z["names"]))
        except ArgumentError as exc:
            raise FormatError(f"{path}: {exc}") from None
        except (OSError, ValueError) as exc:
            raise FormatError(f"{path}: cannot read trace ({exc})") from None


@functools.lru_cache(maxsize=1)
def _default_layout() -> Layout:
    return Layout.deepseek_v41_flash()


# --------------------------------------------------------------------- sources
def read_prompts(path: Union[str, os.PathLike]) -> list[tuple[str, str]]:
    """``(id, prompt)`` pairs of a JSONL prompts file, in file order.

    Raises
    ------
    FormatError
        A non-empty line is not a JSON object with a string ``prompt`` (names the line).
    """
    out = []
    for lineno, obj in read_jsonl(path, "prompts file"):
        if not isinstance(obj.get("prompt"), str):
            raise FormatError(f"{path}: line {lineno}: expected an object with a string 'prompt'")
        out.append((str(obj.get("id", f"line{lineno}")), obj["prompt"]))
    return out


def read_token_file(path: Union[str, os.PathLike]) -> np.ndarray:
    """Token ids from a ``.npy`` array or a text file of integers (whitespace or comma separated).

    Raises
    ------
    FormatError
        The file cannot be read or holds something other than integers (names the item).
    """
    p = Path(path)
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
            if arr.dtype.kind not in "iu":
                raise FormatError(f"{p}: token array must hold integers, got {arr.dtype}")
            return arr.reshape(-1).astype(np.int64)
        items = p.read_text(encoding="utf-8").replace(",", " ").split()
    except OSError as exc:
        raise FormatError(f"{p}: cannot read token file ({exc.strerror})") from None
    out = np.empty(len(items), dtype=np.int64)
    for i, s in enumerate(items):
        try:
            out[i] = int(s)
        except ValueError:
            raise FormatError(f"{p}: item {i} ({s[:20]!r}) is not an integer token id") from None
    return out


def resolve_source(spec: str) -> tuple[str, Path | str]:
    """Resolve a source spec to ``(kind, what)``.

    ``kind`` is one of ``"text"`` (``what`` is the text itself), ``"textfile"``,
    ``"prompts"``, ``"tokens"``, ``"trace"`` (``what`` is a path).

    Raises
    ------
    ArgumentError
        Unknown prefix, or the named file does not exist (names it).
    """
    if spec.startswith("text:"):
        return "text", spec[5:]
    if spec.startswith("stdlib:"):
        path = Path(sysconfig.get_paths()["stdlib"]) / spec[7:]
    elif spec.startswith("package:"):
        rel = spec[8:]
        top, _, rest = rel.partition("/")
        found = importlib.util.find_spec(top)
        if found is None or not found.submodule_search_locations:
            raise ArgumentError(f"source {spec!r}: no installed package {top!r}")
        path = Path(list(found.submodule_search_locations)[0]) / rest
    elif spec.startswith("shared:"):
        path = shared_data_dir() / spec[7:]
    elif spec.startswith("tokens:"):
        path = Path(spec[7:])
        if not path.is_file():
            raise ArgumentError(f"source {spec!r}: no file {path}")
        return "tokens", path
    elif spec.startswith("file:"):
        path = Path(spec[5:])
    else:
        path = Path(spec)
    if not path.is_file():
        raise ArgumentError(f"source {spec!r}: no file {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "prompts", path
    if suffix == ".npz":
        return "trace", path
    if suffix == ".npy":
        return "tokens", path
    return "textfile", path


def load_trace(spec: str, *, limit: Optional[int] = None, layout: Optional[Layout] = None,
               tokenizer_json: Optional[str] = None) -> Trace:
    """Build (or load) the trace named by ``spec`` (see :func:`resolve_source`).

    Parameters
    ----------
    spec : str
        A source spec: ``stdlib:...``, ``package:...``, ``shared:...``,
        ``text:...``, ``tokens:PATH`` or a path (``.jsonl``, ``.npz``, ``.npy``, text).
    limit : int, optional
        Keep only the first ``limit`` tokens.
    layout : Layout, optional
        Default ``Layout.deepseek_v41_flash()`` (ignored for saved ``.npz`` traces).

    Raises
    ------
    ArgumentError, FormatError, TokenError
        Unknown source, unreadable file, or token ids outside the vocabulary.
    """
    if limit is not None and limit < 1:
        raise ArgumentError(f"limit must be >= 1, got {limit}")
    kind, what = resolve_source(spec)
    if kind == "text":
        return Trace.from_text(what, layout=layout, tokenizer_json=tokenizer_json, limit=limit, source="text")
    if kind == "textfile":
        try:
            text = Path(what).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise FormatError(f"{what}: cannot read as UTF-8 text ({exc})") from None
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


# ------------------------------------------------------------------- reuse
def _keys(trace: Trace, per_sequence: bool = True) -> np.ndarray:
    """uint64 ``[T, layers, columns]``: ``(sequence << 34) | (layer << 32) | row``."""
    if trace.layers > 4:
        raise ArgumentError(f"reuse statistics support up to 4 layers, trace has {trace.layers}")
    k = trace.rows.astype(np.uint64)
    k |= (np.arange(trace.layers, dtype=np.uint64) << np.uint64(32))[None, :, None]
    if per_sequence and trace.starts.size > 1:
        k |= (trace.sequence_ids().astype(np.uint64) << np.uint64(34))[:, None, None]
    return k


def repeat_mask(trace: Trace, per_sequence: bool = True) -> np.ndarray:
    """bool ``[T, layers, columns]``: True where ``(layer, row)`` was read earlier in the session.

    "Earlier" follows read order ``[step][layer][column]``; with ``per_sequence``
    each sequence of the trace is its own session.
    """
    keys = _keys(trace, per_sequence).reshape(-1)
    if keys.size == 0:
        return np.zeros(trace.rows.shape, dtype=bool)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rep = first[inverse.reshape(-1)] != np.arange(keys.size)
    return rep.reshape(trace.rows.shape)


def lru_hits(trace: Trace, capacity: int, per_sequence: bool = True) -> np.ndarray:
    """bool ``[T, layers, columns]``: hits of an LRU cache of ``capacity`` rows (both layers together).

    Reads go through the cache in order ``[step][layer][column]``; a miss
    inserts the row and evicts the least recently used one when full.  With
    ``per_sequence`` the cache is emptied at each sequence start.
    """
    if capacity < 0:
        raise ArgumentError(f"LRU capacity must be >= 0 rows, got {capacity}")
    if capacity == 0 or trace.steps == 0:
        return np.zeros(trace.rows.shape, dtype=bool)
    keys = _keys(trace, per_sequence)
    bounds = list(trace.starts) + [trace.steps] if per_sequence else [0, trace.steps]
    out = np.zeros(trace.rows.shape, dtype=bool)
    rep = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = keys[a:b].reshape(-1)
        if np.unique(seg).size <= capacity:  # never evicts: hits are exactly the repeats
            if rep is None:
                rep = repeat_mask(trace, per_sequence)
            out[a:b] = rep[a:b]
            continue
        hits = np.zeros(seg.size, dtype=bool)
        cache: OrderedDict = OrderedDict()
        move, pop = cache.move_to_end, cache.popitem
        keys_list = seg.tolist()
        step = 1 << 18
        with tqdm(total=len(keys_list), unit="read", desc="LRU", delay=2.0, leave=False) as bar:
            for lo in range(0, len(keys_list), step):
                for i, key in enumerate(keys_list[lo:lo + step], lo):
                    if key in cache:
                        move(key)
                        hits[i] = True
                    else:
                        cache[key] = None
                        if len(cache) > capacity:
                            pop(last=False)
                bar.update(min(step, len(keys_list) - lo))
        out[a:b] = hits.reshape(b - a, trace.layers, trace.columns)
    return out


def lru_hit_rate(trace: Trace, capacity: int, per_sequence: bool = True) -> float:
    """Share of row reads served by an LRU row cache of ``capacity`` rows (see :func:`lru_hits`)."""
    if trace.rows.size == 0:
        return 0.0
    return float(lru_hits(trace, capacity, per_sequence).mean())


@dataclass
class ReuseStats:
    """How often a trace's row reads repeat (SPEC §8: 22.5% in a 600-token coding generation).

    Attributes
    ----------
    source : str
    tokens, sequences, reads, repeats, distinct_rows : int
        Steps, sessions, row reads (``tokens * layers * columns``), reads that
        repeat an earlier ``(layer, row)`` of the session, distinct rows read.
    reuse_rate : float
        ``repeats / reads``.
    by_order : dict
        n-gram order (2, 3, 4) -> reuse rate of that order's columns.
    by_layer : dict
        layer id -> reuse rate of that layer's reads.
    by_layer_order : dict
        layer id -> {order -> reuse rate}.
    lru : dict
        cache capacity in rows -> LRU hit rate.
    """

    source: str
    tokens: int
    sequences: int
    reads: int
    repeats: int
    distinct_rows: int
    reuse_rate: float
    by_order: dict
    by_layer: dict
    by_layer_order: dict
    lru: dict

    def to_dict(self) -> dict:
        return {
            "source": self.source, "tokens": self.tokens, "sequences": self.sequences, "reads": self.reads,
            "repeats": self.repeats, "distinct_rows": self.distinct_rows, "reuse_rate": self.reuse_rate,
            "by_order": {str(k): v for k, v in self.by_order.items()},
            "by_layer": {str(k): v for k, v in self.by_layer.items()},
            "by_layer_order": {str(k): {str(o): r for o, r in v.items()} for k, v in self.by_layer_order.items()},
            "lru": {str(k): v for k, v in self.lru.items()},
        }


def reuse_stats(trace: Trace, lru_sizes: Iterable[int] = (), per_sequence: bool = True) -> ReuseStats:
    """Reuse statistics of ``trace`` (see :class:`ReuseStats`).

    Parameters
    ----------
    trace : Trace
    lru_sizes : iterable of int
        Cache capacities (rows, both tables together) whose LRU hit rate to report.
    per_sequence : bool
        Each sequence of the trace is its own session (default); otherwise the
        whole trace is one session.
    """
    rep = repeat_mask(trace, per_sequence)
    orders = trace.orders
    rate = (lambda m: float(m.mean()) if m.size else 0.0)
    by_order = {int(o): rate(rep[:, :, orders == o]) for o in np.unique(orders)}
    by_layer = {lid: rate(rep[:, li, :]) for li, lid in enumerate(trace.layer_ids)}
    by_layer_order = {lid: {int(o): rate(rep[:, li, orders == o]) for o in np.unique(orders)}
                      for li, lid in enumerate(trace.layer_ids)}
    lru = {int(c): lru_hit_rate(trace, int(c), per_sequence) for c in lru_sizes}
    return ReuseStats(
        source=trace.source, tokens=trace.steps, sequences=int(trace.starts.size), reads=int(rep.size),
        repeats=int(rep.sum()), distinct_rows=int(rep.size - rep.sum()), reuse_rate=rate(rep),
        by_order=by_order, by_layer=by_layer, by_layer_order=by_layer_order, lru=lru,
    )
