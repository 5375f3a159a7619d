"""The n-gram hash: token ids -> global row ids of every Engram layer (SPEC §4).

:class:`Hasher` binds a :class:`~engram.layout.Layout` (and optionally a token
map); :class:`History` is the per-sequence state.  ``hash`` handles a prompt or
any chunk of it, ``step`` one decode token without allocating.  The loops are
Cython (``engram/_native/hashing.pyx``) and run without the GIL.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ._checks import as_mask
from ._native.hashing import HashKernel, History
from .errors import ArgumentError, HistoryError, TokenError
from .layout import Layout

__all__ = ["Hasher", "History", "DEAD"]

#: Compressed id of a missing or masked token.
DEAD = -1


def _as_token_array(tokens, vocab_size: int) -> np.ndarray:
    """``tokens`` as a 1-D integer array; ``TokenError`` naming the first bad position."""
    tok = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
    if tok.ndim != 1:
        raise TokenError(f"tokens must be 1-D, got shape {tok.shape}")
    if tok.size and tok.dtype.kind not in "iu":
        if not isinstance(tokens, np.ndarray):
            # A list holding ids beyond int64 becomes float or object: name the culprit.
            for i, v in enumerate(tokens):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TokenError(f"token {v!r} at position {i} is not an integer id")
                if not 0 <= int(v) < vocab_size:
                    raise TokenError(f"token {int(v)} at position {i} is outside the vocabulary [0, {vocab_size})")
        raise TokenError(f"tokens must be integers, got dtype {tok.dtype}")
    if tok.size and not isinstance(tokens, np.ndarray):
        types = set(map(type, tokens))  # a bool among ints becomes 0 or 1 in the array: refuse it as step does
        if bool in types or np.bool_ in types:
            i, v = next((i, v) for i, v in enumerate(tokens) if isinstance(v, (bool, np.bool_)))
            raise TokenError(f"token {v!r} at position {i} is not an integer id")
    if tok.dtype.kind == "u" and tok.size and int(tok.max()) > np.iinfo(np.int64).max:
        i = int(np.argmax(tok))
        raise TokenError(f"token {int(tok[i])} at position {i} is outside the vocabulary [0, {vocab_size})")
    return tok


#: Token arrays up to this length are range-checked in Python (:meth:`Hasher.check_tokens`), longer ones by NumPy.
SHORT_TOKENS = 64


class Hasher:
    """Hash token ids into row ids for every Engram layer of ``layout``.

    Parameters
    ----------
    layout : Layout
        The layout (primes, offsets, multipliers, pad id).
    token_map : array_like of int, optional
        int32 ``[vocab]`` token id -> compressed id (SPEC §3).  ``None`` means
        the ids given to :meth:`hash` and :meth:`step` are already compressed.

    Raises
    ------
    TokenError
        ``token_map`` is not 1-D or holds entries outside
        ``[0, layout.compressed_vocab_size)``.
    """

    def __init__(self, layout: Layout, token_map: Optional[np.ndarray] = None):
        if not isinstance(layout, Layout):
            raise ArgumentError(f"layout must be an engram.Layout, got {type(layout).__name__}")
        self.layout = layout
        tm = None
        if token_map is not None:
            tm = np.asarray(token_map)
            if tm.ndim != 1 or tm.dtype.kind not in "iu" or tm.size == 0:
                raise TokenError(f"token_map must be a non-empty 1-D integer array, got {tm.dtype} {tm.shape}")
            bad = np.flatnonzero((tm < 0) | (tm >= layout.compressed_vocab_size))
            if bad.size:
                i = int(bad[0])
                raise TokenError(
                    f"token_map[{i}] = {int(tm[i])} is outside the compressed vocabulary "
                    f"[0, {layout.compressed_vocab_size})")
            tm = tm.astype(np.int32)
        self.token_map = tm
        self._kernel = HashKernel(layout.primes, layout.offsets, layout.multipliers, layout.heads,
                                  layout.max_ngram, layout.compressed_vocab_size, layout.pad_id, tm)
        #: ``(layers, columns)``: shape of one token's row ids.
        self.step_shape = (layout.layers, layout.columns)

    @property
    def vocab_size(self) -> int:
        """Number of valid input ids: the token map's length, or the compressed size."""
        return int(self.token_map.shape[0]) if self.token_map is not None else self.layout.compressed_vocab_size

    def check_tokens(self, tokens) -> np.ndarray:
        """int64 ``[T]``: ``tokens`` (array_like of int, 1-D) checked against the vocabulary, hashing nothing.

        Raises
        ------
        TokenError
            Not 1-D, not integers, or an id negative or ``>= vocab_size`` (the message names the first
            such id and its position).
        """
        if type(tokens) is np.ndarray and tokens.dtype == np.int64 and tokens.ndim == 1:  # not a subclass (masked)
            tok = tokens if tokens.flags.c_contiguous else np.ascontiguousarray(tokens)  # the decode fast path
            if tok.size <= SHORT_TOKENS:
                # a decode step's few ids, checked by Python's min and max: a NumPy reduction run right after a
                # step's compute (its code and data cold) took ~50 us on the critical path, these ~3 us
                ids = tok.tolist()
                if ids and min(ids) >= 0 and max(ids) < self.vocab_size:
                    return tok
        else:
            tok = np.ascontiguousarray(_as_token_array(tokens, self.vocab_size), dtype=np.int64)
        if tok.size and 0 <= int(tok.min()) and int(tok.max()) < self.vocab_size:
            return tok
        bad = np.flatnonzero((tok < 0) | (tok >= self.vocab_size))
        if bad.size:
            i = int(bad[0])
            raise TokenError(f"token {int(tok[i])} at position {i} is outside the vocabulary [0, {self.vocab_size})")
        return tok

    def new_history(self) -> History:
        """A fresh history (all DEAD) of the right length for this layout."""
        return History(n=self.layout.max_ngram - 1)

    def check_history(self, history) -> History:
        """``history`` itself, if it can come from this layout; else ``HistoryError``.

        A history fits when it is an :class:`History` of ``max_ngram - 1`` ids,
        each DEAD (-1) or a compressed id below ``compressed_vocab_size``.

        Raises
        ------
        HistoryError
            Not a History, another length, or an id outside the compressed
            vocabulary (the message names the id).
        """
        if not isinstance(history, History):
            raise HistoryError(f"history must be an engram.History, got {type(history).__name__}")
        j = self._kernel.check_history(history)
        if j != -1:
            raise HistoryError(self._kernel._history_message(history, j))
        return history

    def hash(self, tokens, mask=None, history: Optional[History] = None) -> np.ndarray:
        """Row ids of every token, layer and column.

        Parameters
        ----------
        tokens : array_like of int, shape ``[T]``
            Token ids in ``[0, vocab_size)``.
        mask : array_like, shape ``[T]``, optional
            True (or 1) where the position is text; False (0: padding, image)
            makes the token DEAD for the hash.  bool or 0/1 integers (an
            attention mask): the one mask rule of every entry point.  Masked
            positions still get rows (their pad n-grams); the consumer must not
            add them (SPEC §4).
        history : History, optional
            State before ``tokens``; advanced past them on success.  ``None``
            hashes from a fresh state and keeps nothing.

        Returns
        -------
        numpy.ndarray
            uint32 ``[T, layers, columns]`` global row ids within each layer's
            table (``[T, 2, 24]`` for V4.1 Flash).

        Raises
        ------
        TokenError
            A token is negative, not an integer, or ``>= vocab_size`` (the message
            names its position), masked positions included.
        MaskError
            ``mask`` has the wrong length or holds values other than bool/0/1
            (an ``ArgumentError``, and a ``TokenError`` for callers that caught
            mask errors as one).
        HistoryError
            ``history`` does not fit this layout.
        On any error neither ``history`` nor any output is changed.
        """
        tok = _as_token_array(tokens, self.vocab_size)
        tok = np.ascontiguousarray(tok, dtype=np.int64)
        T = tok.shape[0]
        mk = None if mask is None else as_mask(mask, T)
        history = self.new_history() if history is None else self.check_history(history)
        out = np.empty((T, self.layout.layers, self.layout.columns), dtype=np.uint32)
        bad = self._kernel.hash_into(tok, mk, history, out)
        if bad >= 0:
            raise TokenError(
                f"token {int(tok[bad])} at position {bad} is outside the vocabulary [0, {self.vocab_size})")
        return out

    def step(self, token: int, history: History, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Row ids of one decode token; advances ``history``.

        Parameters
        ----------
        token : int
            Token id in ``[0, vocab_size)``.
        history : History
            The sequence state, advanced past ``token`` on success.
        out : numpy.ndarray, optional
            uint32 ``[layers, columns]``, C-contiguous and writable.  Passing it
            makes the call allocation-free (the decode fast path).

        Returns
        -------
        numpy.ndarray
            ``out`` (or a new uint32 ``[layers, columns]`` array).

        Raises
        ------
        TokenError, HistoryError, ArgumentError
            Invalid token, history from another layout, or a wrong ``out``;
            nothing is changed then.
        """
        if out is None:
            out = np.empty(self.step_shape, dtype=np.uint32)
        elif not isinstance(out, np.ndarray):
            raise ArgumentError(f"out must be a numpy uint32 array of shape {self.step_shape}, "
                                f"got {type(out).__name__}")
        if not isinstance(history, History):
            raise HistoryError(f"history must be an engram.History, got {type(history).__name__}")
        return self._kernel.step(token, history, out)
