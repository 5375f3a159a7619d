"""What an inference engine calls: a model with its Engram tables, and per-sequence sessions.

:meth:`EngramModel.open` reads the headers of a model file (or split set), the
layout, token map and gate epsilon, and (on first use) the projection and gate
weights.  :meth:`EngramModel.session` gives a :class:`Session` with its own
descriptors and hash history (SPEC §8: tensor-parallel ranks and concurrent
decode sessions each read their own rows).  Text becomes token ids through
:meth:`EngramModel.encode` (or :meth:`EngramModel.tokenizer`), which checks the
tokenizer against the vocabulary the file carries (:mod:`engram.vocabulary`).
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from . import forks as _forks
from ._checks import as_mask, need_array, need_eps, need_finite, shape_str
from .codec import ROW_VALUES
from .drafts import DraftPrefetch, DraftReader
from .errors import ArgumentError, DeviceError, HistoryError, TableIOError, TokenError
from .gguf import HC_STREAMS, ModelInfo, check_finite, read_model
from .hashing import Hasher, History
from .mixer import gated_add, project
from .io_engine import EngineClient, IOEngine, shared_engine
from .prefetch import Prefetcher
from .rowcache import RowCache
from .table import DEFAULT_READERS, DEFAULT_THRESHOLD, Closing, ReadStats, Table, TableGroup
from .vocabulary import TokenizerLike, check_tokenizer, model_tokenizer

__all__ = ["EngramModel", "Session", "LayerWeights", "SESSION_GROUP", "device_session_factory", "ROLLBACK_TOKENS"]

#: Most tokens :meth:`Session.rollback` can undo: the history before each of the last this many decode
#: tokens is kept (3 compressed ids a token).  Speculative decoding rolls back at most its k drafts a step.
ROLLBACK_TOKENS = 1024

#: Entry-point group of the session factories of other devices: ``torch = engram.gpu:session_factory``
#: (setup.cfg).  ``EngramModel.session(device=...)`` loads it, so that ``engram`` never imports torch.
SESSION_GROUP = "engram.sessions"


def device_session_factory(name: str = "torch"):
    """The session factory registered as ``name`` in :data:`SESSION_GROUP` (loaded on each call).

    Raises
    ------
    DeviceError
        None is registered (the package was installed without its entry points:
        reinstall), or loading it failed, e.g. torch is missing (the message names
        the extra ``engram[gpu]``).
    """
    eps = importlib.metadata.entry_points()
    group = eps.select(group=SESSION_GROUP) if hasattr(eps, "select") else eps.get(SESSION_GROUP, ())
    found = [ep for ep in group if ep.name == name]
    if not found:
        raise DeviceError(f"no session factory {name!r} in the entry points {SESSION_GROUP!r}: reinstall engram "
                          f"(pip install --no-build-isolation -e '.[gpu]') to register engram.gpu")
    try:
        return found[0].load()
    except DeviceError:
        raise
    except Exception as exc:
        raise DeviceError(f"the session factory {found[0].value} could not be loaded ({type(exc).__name__}: "
                          f"{exc}); install the extra engram[gpu]") from None


@dataclass(frozen=True)
class LayerWeights:
    """Projection and gate weights of one Engram layer (SPEC §6–§7).

    Attributes
    ----------
    kv : numpy.ndarray
        float16 ``[25600, 6144]``: ``engram_kv`` as the file stores it (315 MB;
        :func:`engram.project` reads F16 directly).
    q_norm, k_norm : numpy.ndarray
        float32 ``[4, 5120]``: RMSNorm weights of the residual streams and keys.
    """

    kv: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray


def _check_cache(cache) -> None:
    """ArgumentError unless ``cache`` is a RowCache or None."""
    if cache is not None and not isinstance(cache, RowCache):
        raise ArgumentError(f"cache must be an engram.RowCache or None, got {type(cache).__name__}")


class EngramModel:
    """The Engram part of one model: layout, token map, tables, weights.

    Use :meth:`open`.  Thread-safe: sessions may be created and used from many
    threads (each session itself is used by one thread at a time).
    """

    def __init__(self, info: ModelInfo, *, eps: Optional[float] = None, backend: str = "auto",
                 readers: int = DEFAULT_READERS, threshold: int = DEFAULT_THRESHOLD, direct: Union[bool, str] = "auto",
                 engine: Union[str, IOEngine] = "shared", cache: Optional[RowCache] = None):
        self.info = info
        _check_cache(cache)
        #: The row cache every session shares unless ``session(cache=...)`` says otherwise (None: none).
        self.cache: Optional[RowCache] = None
        self.layout = info.layout
        self.layer_ids = tuple(info.layout.layer_ids)
        self.token_map = info.token_map
        #: The gate epsilon (SPEC §7) sessions use unless ``session(eps=...)`` says otherwise.
        self.eps = float(info.eps) if eps is None else need_eps(eps)
        self.hasher = Hasher(info.layout, info.token_map)
        self.defaults = dict(backend=backend, readers=readers, threshold=threshold, direct=direct, eps=self.eps,
                             engine=engine, cache=None)
        self._weights: Dict[int, LayerWeights] = {}
        self._lock = threading.Lock()
        # the cache is bound last: an open that fails (a bad eps) leaves it free for another model
        self.cache = self.defaults["cache"] = self._bind_cache(cache, info)
        _forks.track(self)

    def _after_fork_child(self) -> None:
        """In a child after fork(): the weights' lock may be held by a thread of the parent (engram.forks)."""
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], *, eps: Optional[float] = None,
             backend: str = "auto", readers: int = DEFAULT_READERS, threshold: int = DEFAULT_THRESHOLD,
             direct: Union[bool, str] = "auto", engine: Union[str, IOEngine] = "shared",
             cache: Optional[RowCache] = None) -> "EngramModel":
        """Open a model file, one shard of a split set, or a list of shards.

        Only headers are read here (:func:`engram.read_model`); weights load on
        first use (:meth:`weights`), tables are read row by row by sessions.

        Parameters
        ----------
        path : path or sequence of paths
            As :func:`engram.read_model` takes it.
        eps : float, optional
            The gate's RMS-norm epsilon (SPEC §7), finite and ``>= 0``.  Default:
            the file's ``deepseek41.attention.layer_norm_rms_epsilon``; a file
            without it gets :data:`engram.gguf.DEFAULT_EPS` = 1e-6, DeepSeek V4's
            ``rms_norm_eps`` (``model.info.sources["eps"]`` says which).  Ports
            that use 1e-20 (no epsilon) can pass it here.
        backend, readers, threshold, direct
            Defaults of the sessions' tables (see :class:`engram.Table`).
        engine : {"shared", "private"} or IOEngine
            Where sessions read: ``"shared"`` (default) the one I/O engine of
            the table's device (:func:`engram.io_engine.shared_engine`),
            ``"private"`` each session's own readers, or a given engine.
        cache : RowCache, optional
            One row cache shared by every session of the model (:class:`engram.RowCache`:
            raw records of rows read, keyed by ``(layer, row)``); None (default): none.
            ``session(cache=...)`` overrides it per session.  Bound to this model only when the
            open succeeds (a failed open leaves it free for another model).

        Raises
        ------
        FormatError
            The file breaks the format of SPEC §6.
        TableIOError
            A file cannot be read.
        ArgumentError
            ``eps`` is not a finite number ``>= 0``; ``cache`` is not a RowCache.
        CacheLayoutError
            ``cache`` already serves a model of another layout or other tables.
        """
        return cls(read_model(path), eps=eps, backend=backend, readers=readers, threshold=threshold, direct=direct,
                   engine=engine, cache=cache)

    @staticmethod
    def _bind_cache(cache, info: ModelInfo) -> Optional[RowCache]:
        _check_cache(cache)
        if cache is not None:
            cache.bind(info.layout, info.tables, name=str(info.path))
        return cache

    def weights(self, layer_id: int) -> LayerWeights:
        """Weights of ``layer_id``, read on first use and kept: 315 MB a layer (``engram_kv`` stays F16).

        The first call for a layer reads the tensors from the file: 315 MB at the
        file's sequential read speed (0.2-1.6 s measured on the 2-core development
        machine), then checks every value is finite (13 ms, BENCHMARKS.md); later calls return
        the same object.

        Raises
        ------
        ArgumentError
            ``layer_id`` has no Engram table.
        FormatError, TableIOError
            The tensors cannot be read, or hold a NaN or an infinity
            (:func:`engram.gguf.check_finite` names the tensor, the row and column
            and the file offset of the first).
        """
        layer_id = int(layer_id)
        if layer_id not in self.info.layers:
            raise ArgumentError(f"layer {layer_id} has no Engram table (layers: {list(self.layer_ids)})")
        w = self._weights.get(layer_id)
        if w is not None:
            return w
        with self._lock:
            w = self._weights.get(layer_id)
            if w is None:
                layer = self.info.layers[layer_id]
                kv = self.info.read_tensor(layer.kv.name, max_bytes=1 << 31)
                qn = self.info.read_tensor(layer.q_norm.name)
                kn = self.info.read_tensor(layer.k_norm.name)
                for loc, a in ((layer.kv, kv), (layer.q_norm, qn), (layer.k_norm, kn)):
                    check_finite(loc, a)
                qn = np.ascontiguousarray(qn, dtype=np.float32)
                kn = np.ascontiguousarray(kn, dtype=np.float32)
                for a in (kv, qn, kn):
                    a.setflags(write=False)
                w = LayerWeights(kv, qn, kn)
                self._weights[layer_id] = w
        return w

    # ------------------------------------------------------------- text
    def check_tokenizer(self, tokenizer: TokenizerLike = None) -> str:
        """Check that ``tokenizer`` (a tokenizer.json path or a loaded ``tokenizers.Tokenizer``; default the
        DeepSeek V4 one) encodes text for this model; see :func:`engram.vocabulary.check_tokenizer`.

        Engines that tokenize text themselves call this once with their
        tokenizer: token ids of another vocabulary hash to other rows, silently.
        Cheap after the first call for a tokenizer (digests are kept).

        Returns
        -------
        str
            What was compared: ``"vocabulary"`` or, for a file without
            ``tokenizer.ggml.tokens``, ``"token map"``.

        Raises
        ------
        VocabularyError
            The tokenizer's vocabulary is not the file's (names both sources and
            the first token id that differs, with both strings).
        """
        return check_tokenizer(self.info, tokenizer)

    def tokenizer(self, tokenizer: TokenizerLike = None, *, vocabulary: str = "tokenizer"):
        """The ``tokenizers.Tokenizer`` that encodes text for this model.

        ``vocabulary="tokenizer"``: ``tokenizer`` (default the DeepSeek V4 one)
        after :meth:`check_tokenizer`.  ``vocabulary="file"``: a tokenizer with the
        file's own vocabulary and merges (``tokenizer`` gives the pipeline;
        :func:`engram.vocabulary.file_tokenizer`).

        Raises
        ------
        VocabularyError
            The tokenizer does not match the file, or the file carries no
            vocabulary to build one from.
        ArgumentError
            Another ``vocabulary``.
        """
        return model_tokenizer(self.info, tokenizer, vocabulary=vocabulary)

    def encode(self, text: str, tokenizer: TokenizerLike = None, *, vocabulary: str = "tokenizer") -> np.ndarray:
        """int64 ``[T]``: token ids of ``text`` for this model (no special tokens added).

        Feed them to :meth:`Session.step` or :meth:`Session.prefill`.  The
        tokenizer is checked against the file's vocabulary first (see
        :meth:`tokenizer` for ``tokenizer`` and ``vocabulary``).

        Raises
        ------
        VocabularyError, ArgumentError
            As :meth:`tokenizer`; ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise ArgumentError(f"text must be a str, got {type(text).__name__}")
        tok = self.tokenizer(tokenizer, vocabulary=vocabulary)
        return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def session(self, device=None, **overrides) -> "Session":
        """A new decode session with its own descriptors and a fresh history.

        ``device``: None (default) gives a host :class:`Session` (NumPy rows, the
        Cython consumer).  A torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``) gives an
        :class:`engram.gpu.GpuSession` whose rows land decoded on that device, made by
        the ``engram.sessions`` entry point ``torch`` (:func:`device_session_factory`;
        needs the extra ``engram[gpu]``, else :class:`~engram.errors.DeviceError`).

        Keyword overrides: ``backend``, ``readers``, ``threshold``, ``direct`` (the session's
        tables), ``engine`` (``"shared"``, the default: the reads go through the process's engine
        of each table's device, shared with the other sessions, :mod:`engram.io_engine`;
        ``"private"``: the session's own readers per table and for its decode batches; an
        :class:`~engram.io_engine.IOEngine`: that engine), ``eps`` (the gate epsilon of its
        :meth:`Session.apply`; default :attr:`eps`) and ``cache`` (a :class:`engram.RowCache` for
        this session, None for none; default the model's :attr:`cache`; bound to this model only when the
        session opens).

        Raises
        ------
        ArgumentError
            An unknown option, or an invalid value (see :class:`engram.Table`; ``eps``
            must be a finite number ``>= 0``; ``cache`` a RowCache or None).
        CacheLayoutError
            ``cache`` already serves a model of another layout or other tables.
        """
        if device is not None:
            return device_session_factory("torch")(self, device, **overrides)
        unknown = set(overrides) - set(self.defaults)
        if unknown:
            raise ArgumentError(f"unknown session options: {sorted(unknown)} (known: {sorted(self.defaults)})")
        if "cache" in overrides:
            _check_cache(overrides["cache"])  # bound by the session once its tables are open (a failed one binds none)
        return Session(self, **{**self.defaults, **overrides})

    def __repr__(self) -> str:
        return f"EngramModel({str(self.info.path)!r}, layers={list(self.layer_ids)})"


class Session(Closing):
    """One sequence: its own table descriptors and hash history.

    Use from one thread at a time; different sessions are independent.

    Attributes
    ----------
    model : EngramModel
    history : History
        The hash state (the last 3 compressed ids).
    tables : dict[int, Table]
        Layer id -> this session's table.
    last_stats : ReadStats
        Statistics of the last :meth:`step` or :meth:`step_many` read (``prefetch_hits``: rows it took
        from a :meth:`prefetch`).
    last_row_ids : numpy.ndarray
        uint32 ``[layers, 24]``: row ids of the last token of the last :meth:`step` or :meth:`step_many`.
    eps : float
        The gate epsilon of :meth:`apply`.
    cache : RowCache or None
        The row cache of its decode steps (and of its prefills when ``cache.prefill == "admit"``).
    """

    def __init__(self, model: EngramModel, *, backend: str, readers: int, threshold: int,
                 direct: Union[bool, str], eps: float, engine: Union[str, IOEngine] = "shared",
                 cache: Optional[RowCache] = None):
        self.model = model
        self.eps = need_eps(eps)
        self.history = model.hasher.new_history()
        self.tables: Dict[int, Table] = {}
        self._prefetchers: List[Prefetcher] = []
        self._clients: Dict[object, EngineClient] = {}
        #: The history before each of the last decode tokens (at most ROLLBACK_TOKENS), for rollback().
        self._undo: deque = deque(maxlen=ROLLBACK_TOKENS)
        self._drafts: Optional[DraftReader] = None  # the background reader of prefetch(), made on first use
        self._prefetch: Optional[DraftPrefetch] = None  # the drafts the next step may take rows from
        try:
            for lid in model.layer_ids:
                loc = model.info.tables[lid]
                self.tables[lid] = Table(loc.path, loc.offset, loc.rows, backend=backend, readers=readers,
                                         threshold=threshold, direct=direct,
                                         engine=self._engine_client(engine, loc.path))
            first = self.tables[model.layer_ids[0]]
            self._group = TableGroup([self.tables[lid] for lid in model.layer_ids], model.layout.columns,
                                     engine=first.engine_client or "private")
            self.cache = None
            self.use_cache(cache)
        except BaseException:
            self.close()
            raise
        self._ids = np.empty(model.hasher.step_shape, np.uint32)
        self.last_stats = ReadStats()
        self.last_row_ids = np.zeros(model.hasher.step_shape, np.uint32)

    def use_cache(self, cache: Optional[RowCache]) -> None:
        """Read this session's steps (and, with ``cache.prefill == "admit"``, its prefills) through
        ``cache`` from now on; None: no cache.  A measurement switches it off around steps it does not
        want cached.

        Raises
        ------
        ArgumentError
            ``cache`` is not a RowCache or None.
        TableIOError
            The session is closed (nothing bound).
        CacheLayoutError
            ``cache`` serves another model.
        """
        if self.closed:
            raise TableIOError("use_cache: the session is closed; open a new one with model.session()")
        cache = self.model._bind_cache(cache, self.model.info)
        self._group.attach_cache(cache, self.model.layer_ids)
        if self._drafts is not None:
            self._drafts.attach_cache(cache, self.model.layer_ids)
        for lid in self.model.layer_ids:
            self.tables[lid].attach_cache(cache if cache is not None and cache.prefill == "admit" else None, lid)
        self.cache = cache

    def _engine_client(self, engine, path):
        """What a table of ``path`` reads through: the session's client of the engine of the file's
        device (one per device, shared by the session's tables; each table raises the engine's
        depth to its ``readers``), or "private"."""
        if not isinstance(engine, IOEngine) and engine != "shared":
            return engine  # "private", or a wrong value that Table reports
        try:
            eng = engine if isinstance(engine, IOEngine) else shared_engine(path)
        except OSError:
            return engine  # the table's own open reports why
        if eng not in self._clients:
            self._clients[eng] = eng.client()
        return self._clients[eng]

    # ---------------------------------------------------------------- decode
    def step(self, token_id: int) -> Dict[int, np.ndarray]:
        """Rows of one decode token for every Engram layer.

        Hashes ``token_id`` with the session's history and reads the 48 rows of
        both tables as one concurrent batch; when a pending :meth:`prefetch`
        from this history drafted ``token_id`` first, its rows come from there
        instead (see :meth:`step_many`).  :meth:`rollback` can undo the step.

        Returns
        -------
        dict[int, numpy.ndarray]
            Layer id -> float32 ``[24, 256]`` (bf16 values).

        Raises
        ------
        TokenError
            Invalid token id.
        TableIOError
            The session is closed; or the read failed (as RowRangeError and
            DecodeError can): the history is then left as it was, so the step
            can be retried.
        """
        if self.closed:
            raise TableIOError("step: the session is closed; open a new one with model.session()")
        C = self.model.layout.columns
        if self._prefetch is not None:
            hasher = self.model.hasher
            # an int in range is taken as it is (no array: this runs on the critical path, right after the
            # compute); anything else is checked as step_many checks it (TokenError naming it)
            if type(token_id) is int and 0 <= token_id < hasher.vocab_size:
                tok = [token_id]
            elif isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
                raise TokenError(f"token {token_id!r} is not an integer token id")  # as without a prefetch
            else:
                tok = hasher.check_tokens([token_id]).tolist()
            if self._prefetch.matched(self.history, tok):
                rows = self._advance(tok)
                return {lid: r[0] for lid, r in rows.items()}
            self._prefetch, p = None, self._prefetch  # not a draft: dropped, and the step reads as any other
            p.cancel()
        before = self.history.copy()
        ids = self.model.hasher.step(token_id, self.history, self._ids)
        L = ids.shape[0]
        try:
            rows = self._group.read_batch(ids.reshape(1, L * C))
        except BaseException:
            self.history = before
            raise
        self._undo.append(before)
        self.last_stats = self._group.last_stats
        self.last_row_ids = ids.copy()
        return {lid: rows[0, i * C:(i + 1) * C] for i, lid in enumerate(self.model.layer_ids)}

    def step_many(self, token_ids) -> Dict[int, np.ndarray]:
        """Rows of ``T`` decode tokens at once: a verification step of speculative decoding.

        The tokens are hashed one after the other from the session's history, exactly as ``T`` calls
        of :meth:`step` would (the history advances by ``T``), and the rows of all of them, both
        tables, are read as one batch: sorted, each distinct row read once, concurrently (up to
        ``T x 48`` rows), through the session's reader, I/O engine and row cache.  When a
        :meth:`prefetch` of drafts from this same history is pending and the leading tokens are its
        drafts, those tokens' rows come from it (waiting while its read is in flight) and only the
        rest are read; the rest of the prefetch is dropped.  :meth:`rollback` undoes the tokens
        that verification rejects.

        Parameters
        ----------
        token_ids : array_like of int, shape ``[T]``, ``T >= 1``
            Token ids in ``[0, vocab)``, in sequence order.

        Returns
        -------
        dict[int, numpy.ndarray]
            Layer id -> float32 ``[T, 24, 256]`` (bf16 values, C-contiguous): row ``[t]`` is what
            :meth:`step` returns for token ``t``.  ``last_stats`` counts the ``T x 48`` rows
            (``prefetch_hits`` those from the prefetch); ``last_row_ids`` is the last token's.

        Raises
        ------
        ArgumentError
            ``T = 0``.
        TokenError
            A token id is not an integer or lies outside the vocabulary (the message names it and
            its position).
        TableIOError
            The session is closed; or the read failed (as RowRangeError and DecodeError can).
        On every error the history is left as it was (nothing was stepped).
        """
        if self.closed:
            raise TableIOError("step_many: the session is closed; open a new one with model.session()")
        tok = self.model.hasher.check_tokens(token_ids)
        if tok.shape[0] == 0:
            raise ArgumentError("step_many needs at least one token id, got none; the history is untouched")
        return self._advance(tok.tolist())

    def _hash_steps(self, tok: Sequence[int], history: History) -> tuple:
        """Row ids uint32 ``[T, layers, 24]`` of checked tokens (``T`` ints, or int64 ``[T]``) hashed one by
        one (as :meth:`step`) from a copy of ``history``, the history before each token, and the history
        after the last."""
        hasher = self.model.hasher
        ids = np.empty((len(tok), *hasher.step_shape), np.uint32)
        h = history.copy()
        before = []
        for t in range(len(tok)):
            before.append(h.copy())
            hasher.step(int(tok[t]), h, ids[t])
        return ids, before, h

    def _advance(self, tok: List[int]) -> Dict[int, np.ndarray]:
        """Step checked tokens ``tok`` (``T >= 1`` ints): the rows the pending prefetch holds are taken
        from it (its hashes and histories too), the others read as one batch; layer id -> float32
        ``[T, 24, 256]``, C-contiguous (views of the prefetch's buffer when it holds every token).  The
        history, the undo record and the statistics change only once every row is in."""
        t0 = time.perf_counter()
        T = len(tok)
        layers = self.model.layer_ids
        p, self._prefetch = self._prefetch, None
        m = p.matched(self.history, tok) if p is not None else 0
        if m:
            try:
                p.wait()
            except Exception:  # cancelled or failed: this step reads them itself (and raises its own error)
                m = 0
        elif p is not None:
            p.cancel()
        if m == T:  # every row from the prefetch: its buffer becomes the step's, its hashes the step's
            st = ReadStats(backend="prefetch", calls=1)
            rows = {lid: p.layer_rows(i, T) for i, lid in enumerate(layers)}
            before, after, last = p._take(T)
        else:
            ids, before, after = self._hash_steps(tok[m:], p.histories[m] if m else self.history)
            rest = self._group.read_layers(np.ascontiguousarray(ids.transpose(1, 0, 2)))
            st = replace(self._group.last_stats)
            last = ids[-1].copy()
            if m:
                before = p._take(m)[0] + before
                rows = {}
                for i, lid in enumerate(layers):
                    r = rows[lid] = np.empty((T, *rest.shape[2:]), np.float32)
                    r[:m] = p.layer_rows(i, m)
                    r[m:] = rest[i]
            else:
                rows = {lid: rest[i] for i, lid in enumerate(layers)}
        L, C = last.shape
        st.rows_requested += m * L * C
        st.prefetch_hits = m * L * C
        st.wall_s = time.perf_counter() - t0
        self.history = after
        self._undo.extend(before)
        self.last_stats = st
        self.last_row_ids = last
        return rows

    def prefetch(self, draft_ids) -> DraftPrefetch:
        """Start reading, in the background, the rows of drafted tokens given the current history.

        The drafts are hashed from the session's history as :meth:`step_many` would hash them (the
        history does not move) and all ``k x 48`` rows are handed to the session's I/O engine as one
        batch before this returns (through the row cache; on io_uring submitted to the kernel from
        this thread, every read in flight at once where the engine's queue depth allows); the
        session's one background thread (:class:`engram.drafts.DraftReader`) collects and decodes
        them while the caller computes.  The next :meth:`step` or
        :meth:`step_many` from this same history whose leading tokens are the drafts takes their rows
        from here (waiting if the read is still in flight; ``last_stats.prefetch_hits`` counts them)
        and drops the rest; a step whose first token is not the first draft, or that comes after the
        history moved otherwise, cancels it.  A new prefetch cancels the one before; :meth:`close`
        cancels it too.

        Parameters
        ----------
        draft_ids : array_like of int, shape ``[k]``, ``k >= 1``
            The drafted token ids, in sequence order, following the tokens stepped so far.

        Returns
        -------
        DraftPrefetch
            ``wait()``, ``rows()`` (float32 ``[k, layers * 24, 256]``), ``done``, ``stats``,
            ``cancel()``.  Memory: 48 KiB per draft.

        Raises
        ------
        ArgumentError
            No drafts (``k = 0``).
        TokenError
            A draft is not an integer or lies outside the vocabulary (names it and its position).
        TableIOError
            The session is closed.
        On every error nothing is read and a pending prefetch stays as it was.
        """
        if self.closed:
            raise TableIOError("prefetch: the session is closed; open a new one with model.session()")
        tok = self.model.hasher.check_tokens(draft_ids)
        if tok.shape[0] == 0:
            raise ArgumentError("prefetch needs at least one drafted token id (k >= 1), got none")
        ids, before, after = self._hash_steps(tok, self.history)
        if self._drafts is None:
            first = self.tables[self.model.layer_ids[0]]
            self._drafts = DraftReader([self.tables[lid] for lid in self.model.layer_ids], self.model.layout.columns,
                                       engine=first.engine_client or "private")
            self._drafts.attach_cache(self.cache, self.model.layer_ids)
        job = DraftPrefetch(tok, self.history.copy(), ids, before + [after])
        if self._prefetch is not None:
            self._prefetch.cancel()
        self._prefetch = self._drafts.submit(job)
        return job

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` decode tokens from the history: the drafts verification rejected.

        Afterwards the session steps exactly as one that never saw those tokens.  Undoable are the
        tokens of :meth:`step`, :meth:`step_many` and :meth:`step_rows` since the session began or its
        last :meth:`prefill` or :meth:`restore`, at most :data:`ROLLBACK_TOKENS` (1024).  A pending
        :meth:`prefetch` stays: it serves a later step only from the history it was issued at.

        Raises
        ------
        ArgumentError
            ``n`` is not an integer ``>= 0``.
        HistoryError
            ``n`` exceeds the tokens that can be undone (the message gives both).
        On every error the history is untouched.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ArgumentError(f"rollback needs a number of tokens >= 0, got {n!r}; the history is untouched")
        n = int(n)
        if n > len(self._undo):
            raise HistoryError(f"rollback({n}): only {len(self._undo)} decode token(s) can be undone (those stepped "
                               f"since the session began or its last prefill or restore, at most {ROLLBACK_TOKENS}); "
                               f"the history is untouched")
        if n == 0:
            return
        target = self._undo[-n]
        for _ in range(n):
            self._undo.pop()
        self.history = target

    def step_rows(self, token_id: int) -> np.ndarray:
        """Row ids of one decode token without reading: uint32 ``[layers, 24]`` (advances the history;
        :meth:`rollback` can undo it)."""
        before = self.history.copy()
        ids = self.model.hasher.step(token_id, self.history).copy()
        self._undo.append(before)
        return ids

    # --------------------------------------------------------------- prefill
    def prefill(self, token_ids, mask=None, *, chunk_tokens: int = 2048,
                second_table_layer: int = 2, order: str = "chunk") -> Prefetcher:
        """Stream the rows of a prompt in the background.

        Every row id is hashed up front (the history advances past the
        prompt); a reader thread then reads chunks of ``chunk_tokens`` tokens,
        the second table starting once the engine reaches decoder layer
        ``second_table_layer`` (SPEC §8).  ``order`` is ``"chunk"`` (chunk k of
        every table before chunk k+1: engines that run all layers per
        micro-batch) or ``"table"`` (first table whole, then the second:
        engines that run one layer over the whole prompt).

        Parameters
        ----------
        token_ids : array_like of int, shape ``[T]``
        mask : array_like, shape ``[T]``, optional
            bool or 0/1 integers (the one mask rule); False/0 at positions that
            are not text (their rows are still read; pass the same mask to
            :meth:`apply`).

        Returns
        -------
        Prefetcher
            ``wait(layer, upto)``, ``rows(layer, start, stop)``, ``progress``,
            ``cancel()``.  Memory: 24 KiB per token per layer.

        Raises
        ------
        TokenError, MaskError, HistoryError
            As :meth:`engram.Hasher.hash` (nothing is read then).
        TableIOError
            The session is closed (the history is left as it was).
        """
        if self.closed:
            raise TableIOError("prefill: the session is closed")
        row_ids = self.model.hasher.hash(token_ids, mask, self.history)
        self._undo.clear()  # rollback does not reach behind a prompt
        p = Prefetcher([self.tables[lid] for lid in self.model.layer_ids], self.model.layer_ids, row_ids,
                       chunk_tokens=chunk_tokens, second_table_layer=second_table_layer, order=order)
        self._prefetchers = [q for q in self._prefetchers if not q.done] + [p]
        return p

    # ----------------------------------------------------------------- mixing
    def apply(self, layer_id: int, residual: np.ndarray, rows: np.ndarray, mask=None,
              gates_out: Optional[np.ndarray] = None) -> np.ndarray:
        """Project ``rows`` and add them into ``residual`` through the gate (SPEC §7).

        The first call for a layer loads its weights (:meth:`EngramModel.weights`:
        315 MB read from the file, 0.2-1.6 s measured on the 2-core development
        machine); the arguments are checked before that, so a wrong call costs
        nothing.

        Parameters
        ----------
        layer_id : int
        residual : numpy.ndarray
            float32 ``[T, 4, 5120]`` (bf16 values), updated in place.
        rows : numpy.ndarray
            float32 ``[T, 24, 256]`` (from :meth:`step` or a prefetcher).
        mask : array_like, shape ``[T]``, optional
            bool or 0/1 integers, the same mask as :meth:`prefill`'s; False/0
            positions are left untouched.
        gates_out : numpy.ndarray, optional
            float32 ``[T, 4]`` receiving the gates.

        Returns
        -------
        numpy.ndarray
            The projected keys and value, float32 ``[T, 5, 5120]``.

        Raises
        ------
        ArgumentError
            ``layer_id`` has no Engram table; shapes, dtypes or the mask do not
            fit (the message names the array at fault); a NaN or infinity in
            ``residual`` or ``rows`` at a token the mask keeps (names the array,
            token, stream or row, and column of the first one).  ``residual``
            and ``gates_out`` are then untouched.  The finiteness checks (here
            and in :func:`engram.mixer.gated_add`) took 8.7 us at T = 1, 0.06-0.13%
            of the call (its projection reads 315 MB of weights; ``benchmarks.run
            mixer --only finite``).
        """
        info = self.model.info
        layer_id = int(layer_id)
        if layer_id not in info.layers:
            raise ArgumentError(f"layer {layer_id} has no Engram table (layers: {list(self.model.layer_ids)})")
        need_array("residual", residual, np.float32, 3)
        need_array("rows", rows, np.float32, 3)
        T, width = residual.shape[0], info.hidden_size
        if residual.shape[1:] != (HC_STREAMS, width):
            raise ArgumentError(f"residual must have shape [T, {HC_STREAMS}, {width}] ({HC_STREAMS} streams of the "
                                f"model's width {width}), got {shape_str(residual)}")
        columns = self.model.layout.columns
        if rows.shape != (T, columns, ROW_VALUES):
            raise ArgumentError(f"rows must have shape [{T}, {columns}, {ROW_VALUES}] (the {columns} rows of each of "
                                f"the residual's {T} tokens), got {shape_str(rows)}")
        m8 = None if mask is None else as_mask(mask, T)
        need_finite("residual", residual, ("token", "stream", "column"), m8, "; residual and gates_out are untouched")
        need_finite("rows", rows, ("token", "row", "column"), m8, "; residual and gates_out are untouched")
        w = self.model.weights(layer_id)
        kv = project(rows, w.kv)
        gated_add(residual, kv, w.q_norm, w.k_norm, self.eps, mask=m8, gates_out=gates_out)
        return kv

    # ------------------------------------------------------------ checkpoint
    def snapshot(self) -> History:
        """The hash state (3 ids): restoring it resumes the sequence exactly."""
        return self.history.copy()

    def restore(self, history: History) -> None:
        """Continue from a snapshot.

        Raises
        ------
        HistoryError
            The snapshot does not fit this model's layout.
        """
        if not isinstance(history, History):
            raise HistoryError(f"restore needs an engram.History, got {type(history).__name__}")
        self.history = self.model.hasher.check_history(history).copy()
        self._undo.clear()

    # -------------------------------------------------------------- lifetime
    @property
    def closed(self) -> bool:
        return not self.tables

    def close(self) -> None:
        """Cancel running prefetches, stop the readers, close the descriptors (idempotent)."""
        for p in getattr(self, "_prefetchers", []):
            p.cancel()
        self._prefetchers = []
        drafts, self._drafts, self._prefetch = getattr(self, "_drafts", None), None, None
        if drafts is not None:
            drafts.close()  # cancels the pending prefetch; waits for a read in flight
        group = getattr(self, "_group", None)
        if group is not None:
            group.close()
        for t in getattr(self, "tables", {}).values():
            t.close()
        self.tables = {}
        for c in getattr(self, "_clients", {}).values():
            c.close()  # the last session on a device stops its engine
        self._clients = {}

