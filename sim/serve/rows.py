"""The rows each request reads: its prompt's, streamed in chunks, and one token's a decode step (SPEC §4, §8).

Rows come from real text through the real tokenizer and hash (a :class:`~sim.trace.Trace`: the
``text``, or a synthetic trace of a target reuse rate, ``synth:reuse=R``), or from a request's own
prompt (a requests file), hashed from a fresh history.

Where a request reads (:meth:`RowSource.place`)
    A request whose prompt is a stretch of the text starts at a chunk boundary of the text (a
    multiple of ``read_chunk`` tokens, chosen by the request's uniform draw) and its decode tokens
    continue the text right after its prompt.  A request with its own prompt decodes a stretch of
    the text from a position chosen by the same draw.  Positions wrap around the text (its first
    ``read_chunk``-multiple of tokens).

Prefill reads (:meth:`RowSource.prompt_reads`)
    The engine's background reader streams a prompt in chunks of ``read_chunk`` tokens (2048 in
    the reference engine), one batch per chunk and table, each distinct row once (SPEC §8).  The
    distinct rows of every prefix of every chunk of the text are counted once (a table
    ``[chunks, tables, read_chunk + 1]``), so a request's chunk reads cost a lookup.

Decode reads (:meth:`RowSource.decode_reads`)
    A step reads the rows of every request it decodes as one batch: the ``B x 48`` row ids are
    gathered, DRAM-resident rows dropped (``Policy.dram_fraction``, a hot set), the hits of each
    request's own row cache dropped (``Policy.cache_rows``), and the rest counted once each
    (cross-request deduplication), per table and per drive (``row id mod drives``).

A shared row cache (``Policy.shared_cache_rows``, :class:`SharedRowCache`) sees every batch's
distinct rows in the order the device gets them; it is exact: the engine's own policy code
(:class:`engram.rowcache.CachePolicy`, ``Policy.cache_policy``), a batch looked up, then its misses
inserted, as :class:`engram.RowCache` does.

Row keys are ``uint32``: ``row | (table << 30)`` (every V4.1 table has fewer than ``2**30`` rows); a row cache's
policy sees the engine's keys ``(layer id << 32) | row`` instead (:meth:`RowSource.cache_keys`), as the engine's
cache does.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY, CachePolicy, cache_key

from ..decode import resident_mask
from sim.core.params import Policy
from ..trace import Trace
from .workload import RequestFile, Requests

__all__ = ["DEFAULT_READ_CHUNK", "RowSource", "SharedRowCache", "TABLE_SHIFT"]

#: Tokens per chunk of the engine's background prefill reader (``engram.Session.prefill``, SPEC §8).
DEFAULT_READ_CHUNK = 2048
#: Bit of a row key where the table index starts.
TABLE_SHIFT = 30
_ROW_MASK = np.uint32((1 << TABLE_SHIFT) - 1)


def _prefix_counts(keys: np.ndarray, resident: Optional[np.ndarray], chunk: int, layers: int) -> np.ndarray:
    """int32 ``[chunks, layers, chunk + 1]``: distinct non-resident rows of each table in the first ``p`` tokens
    of each chunk."""
    T, W = keys.shape
    C = W // layers
    nch = T // chunk
    out = np.zeros((nch, layers, chunk + 1), dtype=np.int32)
    for c in range(nch):
        for j in range(layers):
            v = keys[c * chunk:(c + 1) * chunk, j * C:(j + 1) * C].reshape(-1)
            pos = np.arange(v.size)
            if resident is not None:
                keep = ~resident[c * chunk:(c + 1) * chunk, j * C:(j + 1) * C].reshape(-1)
                v, pos = v[keep], pos[keep]
            _, first = np.unique(v, return_index=True)
            per_token = np.bincount(pos[first] // C, minlength=chunk)
            out[c, j, 1:] = np.cumsum(per_token)
    return out


def _chunk_counts(keys: np.ndarray, resident: Optional[np.ndarray], chunk: int, layers: int) -> np.ndarray:
    """int64 ``[chunks, layers]``: distinct non-resident rows of each chunk of ``keys`` (``[T, layers * C]``)."""
    T, W = keys.shape
    C = W // layers
    nch = -(-T // chunk)
    out = np.zeros((nch, layers), dtype=np.int64)
    for c in range(nch):
        for j in range(layers):
            v = keys[c * chunk:(c + 1) * chunk, j * C:(j + 1) * C]
            if resident is not None:
                v = v[~resident[c * chunk:(c + 1) * chunk, j * C:(j + 1) * C]]
            out[c, j] = np.unique(v).size
    return out


class RowSource:
    """Every row a run's requests read (see the module docstring).

    Parameters
    ----------
    text : Trace
        The text the prompts are stretches of and the decode tokens continue (at least ``read_chunk`` tokens).
    policy : Policy
        ``dram_fraction`` (resident rows); the caches are the engine's.
    read_chunk : int
        Tokens per background-reader chunk.
    hot : numpy.ndarray, optional
        A hot set resident in DRAM (:func:`sim.decode.hot_rows`).
    file : RequestFile, optional
        The requests file whose prompts are hashed as their own sequences.

    Attributes
    ----------
    keys : numpy.ndarray
        uint32 ``[T, layers * columns]``: row keys of the text, then of every prompt of ``file``.
    text_tokens : int
        Tokens of the text used (a multiple of ``read_chunk``).
    layers, columns : int
    resident : numpy.ndarray or None
        bool like ``keys``: rows served from DRAM.

    Raises
    ------
    ArgumentError
        A text shorter than ``read_chunk``, a table with ``2**30`` rows or more, ``read_chunk < 1``.
    """

    def __init__(self, text: Trace, policy: Policy = Policy(), read_chunk: int = DEFAULT_READ_CHUNK, *,
                 hot: Optional[np.ndarray] = None, file: Optional[RequestFile] = None):
        if read_chunk < 1:
            raise ArgumentError(f"read_chunk must be >= 1 token, got {read_chunk}")
        if text.steps < read_chunk:
            raise ArgumentError(f"the text {text.source!r} has {text.steps} tokens, fewer than one read chunk "
                                f"({read_chunk}): give a longer text (trace_limit) or a smaller read_chunk")
        if text.rows.size and int(text.rows.max()) >= 1 << TABLE_SHIFT:
            raise ArgumentError(f"row ids of {text.source!r} reach 2**{TABLE_SHIFT}: too large for the row keys")
        self.read_chunk = int(read_chunk)
        self.layers, self.columns = text.layers, text.columns
        self.layer_ids = tuple(text.layer_ids)
        self._layer_keys = cache_key(np.asarray(self.layer_ids, np.uint64), 0)  # row 0 of each table: its key's top
        self.source = text.source
        self.text_tokens = (text.steps // self.read_chunk) * self.read_chunk
        parts = [text.rows[: self.text_tokens]]
        self.own: Dict[int, Tuple[int, int]] = {}
        start = self.text_tokens
        if file is not None:
            layout_ids = None
            for i, toks in enumerate(file.tokens):
                if toks is None or toks.size == 0:
                    continue
                tr = Trace.from_tokens(toks, source=f"{file.path}#{file.ids[i]}")
                if layout_ids is None:
                    layout_ids = tr.layer_ids
                parts.append(tr.rows)
                self.own[i] = (start, int(toks.size))
                start += int(toks.size)
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        tables = (np.arange(self.layers, dtype=np.uint32) << np.uint32(TABLE_SHIFT))[None, :, None]
        self.keys = np.ascontiguousarray((rows.astype(np.uint32) | tables).reshape(rows.shape[0], -1))
        res = resident_mask(rows, policy.dram_fraction, hot) if (policy.dram_fraction > 0 or hot is not None) \
            else None
        self.resident = None if res is None or not res.any() else res.reshape(rows.shape[0], -1)
        self.prefix = _prefix_counts(self.keys[: self.text_tokens], self._res(0, self.text_tokens),
                                     self.read_chunk, self.layers)
        self.own_counts = {i: _chunk_counts(self.keys[a:a + n], self._res(a, a + n), self.read_chunk, self.layers)
                           for i, (a, n) in self.own.items()}

    def _res(self, a: int, b: int) -> Optional[np.ndarray]:
        return None if self.resident is None else self.resident[a:b]

    @property
    def chunks(self) -> int:
        """Chunks of the text."""
        return self.text_tokens // self.read_chunk

    # ------------------------------------------------------------------ placing
    def place(self, reqs: Requests) -> Tuple[np.ndarray, np.ndarray]:
        """``(prompt start, decode start)``, int64 ``[n]`` positions in :attr:`keys` (see the module)."""
        nch = self.chunks
        chunk_of = np.minimum((reqs.draw * nch).astype(np.int64), nch - 1)
        ppos = chunk_of * self.read_chunk
        dpos = (ppos + reqs.prompt) % self.text_tokens
        own = reqs.source >= 0
        if own.any():
            for i in np.flatnonzero(own):
                s = int(reqs.source[i])
                if s not in self.own:
                    raise ArgumentError(f"request {i}: its prompt (line {s + 1} of the requests file) has no text")
                ppos[i] = self.own[s][0]
            dpos[own] = np.minimum((reqs.draw[own] * self.text_tokens).astype(np.int64), self.text_tokens - 1)
        return ppos, dpos

    def prompt_reads(self, source: int, ppos: int, tokens: int) -> np.ndarray:
        """int64 ``[chunks, layers]``: rows each chunk of a prompt reads from the device, per table.

        ``source`` >= 0: the requests file's own prompt (its whole length); else ``tokens`` of the text from
        the chunk boundary ``ppos``.
        """
        if source >= 0:
            return self.own_counts[int(source)]
        ch, nch = self.read_chunk, self.chunks
        n = -(-int(tokens) // ch)
        first = int(ppos) // ch
        idx = (first + np.arange(n)) % nch
        out = self.prefix[idx, :, ch].astype(np.int64)
        last = int(tokens) - (n - 1) * ch
        if last < ch:
            out[-1] = self.prefix[idx[-1], :, last]
        return out

    # ------------------------------------------------------------------ decoding
    def decode_keys(self, pos: np.ndarray, hits: Optional[np.ndarray] = None) -> np.ndarray:
        """uint32, sorted: the distinct keys a decode step reads for tokens at text positions ``pos`` (int64
        ``[B]``), after resident rows and ``hits`` (bool ``[B, layers * columns]``: the requests' own caches)."""
        k = self.keys[pos]
        drop = None
        if self.resident is not None:
            drop = self.resident[pos]
        if hits is not None:
            drop = hits if drop is None else (drop | hits)
        flat = k[~drop] if drop is not None else k.reshape(-1)
        flat = np.sort(flat)
        if flat.size > 1:
            flat = flat[np.concatenate(([True], flat[1:] != flat[:-1]))]
        return flat

    def count_distinct(self, pos: np.ndarray) -> int:
        """Distinct rows of tokens at ``pos`` (no resident rows, no caches): the common case, fast."""
        if pos.size == 1:  # one token's rows are all distinct (every column owns its own range of rows)
            return int(self.keys.shape[1])
        flat = np.sort(self.keys[pos].reshape(-1))
        return int(flat.size and 1 + np.count_nonzero(flat[1:] != flat[:-1]))

    def split(self, keys: np.ndarray, drives: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(per table [layers, drives] counts, per drive [drives] counts)`` of distinct keys."""
        t = (keys >> np.uint32(TABLE_SHIFT)).astype(np.int64)
        d = ((keys & _ROW_MASK) % np.uint32(drives)).astype(np.int64) if drives > 1 else np.zeros(keys.size, np.int64)
        both = np.bincount(t * drives + d, minlength=self.layers * drives).reshape(self.layers, drives)
        return both, both.sum(axis=0)

    def cache_keys(self, keys: np.ndarray) -> np.ndarray:
        """uint64 like ``keys``: the engine's row-cache keys ``(layer id << 32) | row``
        (:func:`engram.rowcache.cache_key`) of this source's keys, so that a policy sees, and a TinyLFU sketch
        hashes, the keys the engine's cache does."""
        k = np.asarray(keys, np.uint32)
        return self._layer_keys[k >> np.uint32(TABLE_SHIFT)] | (k & _ROW_MASK).astype(np.uint64)

    def stream_keys(self, dpos: int, tokens: int) -> np.ndarray:
        """uint32 ``[tokens, layers * columns]``: keys of ``tokens`` decode tokens from text position ``dpos``."""
        return self.keys[(int(dpos) + np.arange(int(tokens))) % self.text_tokens]

    def stream_resident(self, dpos: int, tokens: int) -> Optional[np.ndarray]:
        if self.resident is None:
            return None
        return self.resident[(int(dpos) + np.arange(int(tokens))) % self.text_tokens]

    def chunk_keys(self, source: int, ppos: int, tokens: int, c: int, table: int) -> np.ndarray:
        """uint32: the distinct non-resident keys of chunk ``c`` of a prompt in one table (for a shared cache)."""
        ch = self.read_chunk
        if source >= 0:
            a, n = self.own[int(source)]
            lo, hi = a + c * ch, a + min(n, (c + 1) * ch)
            rows = np.arange(lo, hi)
        else:
            rows = (int(ppos) + c * ch + np.arange(min(ch, int(tokens) - c * ch))) % self.text_tokens
        C = self.columns
        k = self.keys[rows, table * C:(table + 1) * C]
        if self.resident is not None:
            k = k[~self.resident[rows, table * C:(table + 1) * C]]
        return np.unique(k)


class SharedRowCache:
    """One row cache shared by every request (``Policy.shared_cache_rows``): the engine's policy, exact, in
    access order (``policy``: ``"lru"`` or ``"tinylfu"``, :data:`engram.rowcache.POLICIES`; default the
    engine's, :data:`engram.rowcache.DEFAULT_POLICY`), on the engine's keys (``rows``: the
    :class:`RowSource` whose keys it is fed, :meth:`RowSource.cache_keys`; None: the keys as given)."""

    def __init__(self, capacity: int, policy: str = DEFAULT_POLICY, rows: Optional["RowSource"] = None):
        self.capacity = int(capacity)
        self._policy = CachePolicy(self.capacity, policy)
        self._rows = rows
        self.hits = 0
        self.requests = 0

    def misses(self, keys: np.ndarray) -> np.ndarray:
        """The keys of a batch (distinct, uint32) that miss; every key then counts as used now (misses are
        inserted)."""
        k32 = np.ascontiguousarray(keys, np.uint32)
        k = np.ascontiguousarray(self._rows.cache_keys(k32) if self._rows is not None else k32.astype(np.uint64))
        slots = np.empty(k.size, np.int64)
        self._policy.lookup(k, slots)
        miss = slots < 0
        self._policy.insert(np.ascontiguousarray(k[miss]), np.empty(int(miss.sum()), np.int64))
        self.requests += int(k.size)
        self.hits += int(k.size) - int(miss.sum())
        return k32[miss]
