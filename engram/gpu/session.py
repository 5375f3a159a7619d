"""Decode sessions whose rows land on a torch device (issue 22): step, overlap, batches, prefill, apply.

A :class:`GpuSession` wraps a host :class:`engram.Session` (its descriptors,
hash history and reads through the device's shared I/O engine) and adds the
device half: page-locked staging, a copy stream of its own, the decode kernel,
and the layers' weights resident on the device (F16 ``engram_kv``, loaded once
per model, device and layer from the GGUF file, shared by every session).

Per decode token::

    token --hash--> row ids [2, 24] --read_raw (engine, O_DIRECT)--> pinned staging [48, 264]
          --async H2D copy (session stream)--> device [48, 264] --decode kernel--> bf16 [2, 24, 256]

:meth:`GpuSession.step_async` starts layer 1's read at once (on the calling
thread) and layer 14's on the session's background reader; the returned
:class:`StepHandle`'s ``rows_ready(layer)`` gives the stream-ordered signal
the caller waits on, so its kernels of layers 2-13 run while layer 14's rows
are read.  :func:`step_batch` reads B sessions' tokens as one deduplicated
batch with one copy.  :meth:`GpuSession.capture` gives the consumer of a step
as a CUDA graph (:mod:`engram.gpu.graph`).

Made by ``EngramModel.session(device=...)`` through the entry point
``engram.sessions: torch`` (:func:`session_factory`), or directly.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .._checks import as_mask, need_int, need_layer
from ..codec import ROW_BYTES, ROW_VALUES
from ..errors import ArgumentError, TableIOError
from ..gguf import HC_STREAMS
from ..prefetch import PrefetchCancelled
from . import kernels
from .graph import CapturedStep
from .staging import Staging, device_memory, new_stream, resolve_device

__all__ = ["GpuSession", "StepHandle", "RowsReady", "DevicePrefill", "DeviceWeights", "step_batch",
           "session_factory", "device_weights"]


# ------------------------------------------------------------------ resident weights
def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The bytes ``a`` and ``b`` may address overlap (same device; from the first to the last element)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        lo = t.data_ptr()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)
        return lo, lo + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


@dataclass(frozen=True)
class DeviceWeights:
    """A layer's consumer weights on a device.

    Attributes
    ----------
    kv16 : torch.Tensor
        float16 ``[25600, 6144]``: ``engram_kv`` as stored (315 MB).
    w64 : torch.Tensor
        float64 ``[4, 5120]``: ``q_norm * k_norm`` (exact), the gate's weights.
    eps_t : torch.Tensor
        float64 ``[1]``: the gate epsilon, on the device.
    """

    kv16: torch.Tensor
    w64: torch.Tensor
    eps_t: torch.Tensor


_WEIGHTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_WEIGHTS_LOCK = threading.Lock()


def device_weights(model, layer_id: int, device: torch.device, eps: float) -> DeviceWeights:
    """The weights of ``layer_id`` on ``device``: loaded once per model, device and layer (then shared).

    Raises
    ------
    ArgumentError
        ``layer_id`` has no Engram table.
    DeviceError
        The device ran out of memory.
    FormatError, TableIOError
        As :meth:`engram.EngramModel.weights`.
    """
    with _WEIGHTS_LOCK:
        per_model = _WEIGHTS.setdefault(model, {})
        key = (str(device), int(layer_id), float(eps))
        w = per_model.get(key)
        if w is not None:
            return w
        host = model.weights(layer_id)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the host arrays are read-only; never written here
            kv = torch.from_numpy(host.kv)
            qn, kn = torch.from_numpy(host.q_norm), torch.from_numpy(host.k_norm)
        with device_memory(device, f"layer {layer_id}'s engram_kv ({host.kv.nbytes} bytes)"):
            kv16 = kv.to(device) if device.type != "cpu" else kv
            w64 = kernels.gate_weights(qn.to(device), kn.to(device))
            eps_t = torch.full((1,), float(eps), dtype=torch.float64, device=device)
        w = DeviceWeights(kv16, w64, eps_t)
        per_model[key] = w
        return w


# ------------------------------------------------------------------ signals
class RowsReady:
    """The stream-ordered signal that a layer's rows are on the device.

    ``wait(stream=None)`` blocks the host until the layer's read has finished
    (the GPU keeps running what was queued meanwhile), then makes ``stream``
    (default the current one) wait on the event recorded after the rows'
    copy and decode, so work queued after it sees the rows.  ``event`` is that
    ``torch.cuda.Event`` (None on the CPU, where the copy is synchronous).
    """

    def __init__(self, future: Future, layer_id: int, on_error, device: torch.device):
        self._future = future
        self.layer_id = layer_id
        self._on_error = on_error
        self.device = device

    @property
    def event(self) -> Optional["torch.cuda.Event"]:
        return self._result()

    def done(self) -> bool:
        """The read has finished (the copy may still be in flight on the device)."""
        return self._future.done()

    def _result(self):
        try:
            return self._future.result()
        except BaseException:
            self._on_error()
            raise

    def wait(self, stream: Optional["torch.cuda.Stream"] = None) -> None:
        """Block until read; order ``stream`` (default current) after the copy and decode.

        Raises
        ------
        TableIOError, RowRangeError, DecodeError
            The layer's read failed (the session's history is then put back
            to before the token, so the step can be retried).
        """
        ev = self._result()
        if ev is not None:
            (stream or torch.cuda.current_stream(self.device)).wait_event(ev)


class StepHandle:
    """One decode token's rows on their way to the device (:meth:`GpuSession.step_async`).

    Attributes
    ----------
    rows : dict[int, torch.Tensor]
        Layer id -> bfloat16 ``[24, 256]`` on the device; valid once
        :meth:`rows_ready` of that layer has been waited on.
    row_ids : numpy.ndarray
        uint32 ``[layers, 24]``.
    """

    def __init__(self, rows: Dict[int, torch.Tensor], ready: Dict[int, RowsReady], row_ids: np.ndarray):
        self.rows = rows
        self._ready = ready
        self.row_ids = row_ids

    def rows_ready(self, layer_id: int) -> RowsReady:
        """The signal of ``layer_id``'s rows (see :class:`RowsReady`)."""
        return self._ready[need_layer(layer_id, sorted(self._ready))]

    def wait(self) -> Dict[int, torch.Tensor]:
        """Wait for every layer (the current stream ordered after each) and return :attr:`rows`."""
        for r in self._ready.values():
            r.wait()
        return self.rows


# ------------------------------------------------------------------ the session
def _one_thread_at_a_time(method):
    """Run ``method`` under the session's use lock: a second thread waits for the first (a session's history
    and staging buffers hold one sequence; two threads interleaved left a token's rows made from another
    token's records)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._use_lock:
            return method(self, *args, **kwargs)
    return locked


def _need_tensor(name: str, t, dtype: torch.dtype, device: torch.device, shape: tuple, untouched: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor {str(dtype)[6:]} of shape {list(shape)} on {device}, "
                            f"got {type(t).__name__}{untouched}")
    if t.dtype != dtype:
        raise ArgumentError(f"{name} must have dtype {str(dtype)[6:]}, got {str(t.dtype)[6:]}{untouched}")
    if t.device != device:
        raise ArgumentError(f"{name} is on {t.device}, the session's device is {device}{untouched}")
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(f"{name} must have shape {list(shape)}, got {list(t.shape)}{untouched}")


class GpuSession:
    """A decode session on a torch device: rows read into pinned memory, copied raw, decoded there.

    Parameters
    ----------
    model : engram.EngramModel
    device : str or torch.device
        ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (the same torch code on the CPU:
        nothing pinned, the copy a plain ``copy_``, the projection by the CPU
        path's own F16 kernel; how CI tests the logic, not a fast path: the host
        :class:`engram.Session` is the CPU consumer).
    max_batch : int
        Tokens of :func:`step_batch` the staging is first sized for (it grows on demand).
    **overrides
        Options of the host session (``backend``, ``readers``, ``threshold``,
        ``direct``, ``engine``, ``eps``; see :meth:`engram.EngramModel.session`).

    Raises
    ------
    DeviceError
        The device does not exist (CUDA absent, index past the count) or ran out of memory.
    ArgumentError, TableIOError
        As :meth:`engram.EngramModel.session`.

    Calls from several threads are serialised (``step``, ``step_async``, ``prefill``, :func:`step_batch`,
    :meth:`CapturedStep.begin` take the session's lock): a session holds one sequence, so the order of
    two threads' tokens is theirs to choose.

    Attributes
    ----------
    device : torch.device
    host : engram.Session
        The host half: tables, history (``history``), statistics of the last read.
    stream : torch.cuda.Stream or None
        The session's copy stream (None on the CPU).
    """

    def __init__(self, model, device="cuda", *, max_batch: int = 1, **overrides):
        self.device = resolve_device(device)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ArgumentError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.model = model
        self._use_lock = threading.RLock()
        self.layer_ids = tuple(model.layer_ids)
        self.columns = model.layout.columns
        self._pool: Optional[ThreadPoolExecutor] = None
        self.host = model.session(**overrides)
        try:
            self.stream = new_stream(self.device)
            L, C = len(self.layer_ids), self.columns
            self._step_staging = Staging(1, L * C, self.device)
            self._layer_staging = [Staging(1, C, self.device) for _ in self.layer_ids]
            self._batch_staging = Staging(max_batch, L * C, self.device)
            self._copied: Dict[int, Optional[torch.cuda.Event]] = {}
        except BaseException:
            self.host.close()
            raise
        self._exact: Dict[int, tuple] = {}  # data_ptr of a rows buffer -> (end, f16-exact, weakref)
        self._prefills: List["DevicePrefill"] = []
        self._lock = threading.Lock()
        self.last_handle: Optional[StepHandle] = None

    # -------------------------------------------------------------- state
    @property
    def history(self):
        return self.host.history

    @property
    def closed(self) -> bool:
        return self.host.closed

    @property
    def eps(self) -> float:
        return self.host.eps

    @property
    def pinned(self) -> bool:
        """The staging buffers are page-locked (always on CUDA; never on the CPU)."""
        return self._step_staging.pinned

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise TableIOError(f"{what}: the session is closed; open a new one with model.session(device=...)")

    def weights(self, layer_id: int) -> DeviceWeights:
        """The layer's weights on this device (:func:`device_weights`)."""
        return device_weights(self.model, need_layer(layer_id, self.layer_ids), self.device, self.eps)

    # -------------------------------------------------------------- the device half of a read
    def _wait_copied(self, staging: Staging) -> None:
        """The previous async copy out of ``staging`` has finished (its host buffer may be refilled)."""
        ev = self._copied.get(id(staging))
        if ev is not None:
            ev.synchronize()

    def _to_device(self, staging: Staging, n_tokens: int, rows: torch.Tensor,
                   x16: Optional[torch.Tensor] = None) -> Optional["torch.cuda.Event"]:
        """Copy ``n_tokens`` staged tokens raw to the device and decode them into ``rows``
        (bf16 ``[n_tokens * columns, 256]``); returns the event after the decode (None on the CPU)."""
        raw = staging.upload(n_tokens, self.stream)
        flat = raw.view(-1, ROW_BYTES)
        if self.stream is None:
            kernels.decode_raw(flat, rows, x16)
            return None
        with torch.cuda.stream(self.stream):
            copied = torch.cuda.Event()
            copied.record(self.stream)
            kernels.decode_raw(flat, rows, x16)
            done = torch.cuda.Event()
            done.record(self.stream)
        self._copied[id(staging)] = copied
        return done

    def _new_rows(self, n_rows: int) -> torch.Tensor:
        with device_memory(self.device, f"{n_rows} decoded rows"):
            return torch.empty((n_rows, ROW_VALUES), dtype=torch.bfloat16, device=self.device)

    def _note_exact(self, rows: torch.Tensor, staged: np.ndarray) -> None:
        """Remember whether the rows in ``rows`` (made from ``staged`` records) are exact in f16."""
        lo, hi = kernels.F16_EXACT_SCALES
        s = staged[..., ROW_VALUES:]
        exact = bool(((s >= lo) & (s <= hi)).all())
        start = rows.data_ptr()
        with self._lock:
            if len(self._exact) > 64:
                self._exact.pop(next(iter(self._exact)))
            # a weak reference: once the rows are gone their memory may hold other values
            self._exact[start] = (start + rows.numel() * rows.element_size(), exact, weakref.ref(rows))

    def _is_exact(self, rows: torch.Tensor, x16: torch.Tensor) -> bool:
        p = rows.data_ptr()
        with self._lock:
            for start, (end, exact, alive) in list(self._exact.items()):
                if alive() is None:
                    del self._exact[start]
                elif start <= p < end:
                    return exact
        # rows made elsewhere: check on the device (one host synchronisation)
        return bool(torch.equal(x16.to(torch.bfloat16), rows.reshape(x16.shape)))

    def _publish(self, rows: torch.Tensor) -> None:
        if self.device.type == "cuda":
            rows.record_stream(torch.cuda.current_stream(self.device))

    # -------------------------------------------------------------- decode
    @_one_thread_at_a_time
    def step(self, token_id: int) -> Dict[int, torch.Tensor]:
        """Rows of one decode token for every Engram layer, on the device.

        One read of the 48 rows (both tables, one batch through the shared
        engine) into pinned staging, one async copy of the raw records on the
        session's stream, the decode kernel there; the current stream is
        ordered after it.

        Returns
        -------
        dict[int, torch.Tensor]
            Layer id -> bfloat16 ``[24, 256]`` on the device, bit-identical to
            :func:`engram.decode_rows` of the records (the host session's ``step``).

        Raises
        ------
        TokenError
            Invalid token id.
        TableIOError
            The session is closed, or the read failed (as RowRangeError and
            DecodeError can): the history is then left as it was.
        DeviceError
            The device ran out of memory.
        """
        self._check_open("step")
        host = self.host
        before = host.history.copy()
        ids = self.model.hasher.step(token_id, host.history)
        L, C = ids.shape
        st = self._step_staging
        try:
            self._wait_copied(st)
            host._group.read_raw(ids.reshape(1, L * C), st.host_np[:1])
            rows = self._new_rows(L * C)
            self._note_exact(rows, st.host_np[:1])
            done = self._to_device(st, 1, rows)  # a failed copy or decode after a good read: the history goes back too
        except BaseException:
            host.history = before
            raise
        host._undo.append(before)
        host.last_stats = host._group.last_stats
        host.last_row_ids = ids.copy()
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        self._publish(rows)
        rows = rows.view(L, C, ROW_VALUES)
        return {lid: rows[i] for i, lid in enumerate(self.layer_ids)}

    def step_many(self, token_ids) -> Dict[int, torch.Tensor]:
        """Rows of ``T`` decode tokens at once, on the device: a verification step of speculative decoding.

        As :meth:`engram.Session.step_many` (the tokens hashed one after the other from the history,
        which advances by ``T``; all ``T x 48`` rows read as one deduplicated batch), the raw records
        landing in the session's pinned batch staging (grown to ``T`` tokens if smaller), copied to
        the device in one async copy and decoded there.  Drafts prefetched on the host session
        (``session.host.prefetch``) are not taken here: every row is read.

        Returns
        -------
        dict[int, torch.Tensor]
            Layer id -> bfloat16 ``[T, 24, 256]`` on the device (a view of one ``[T, layers, 24, 256]``
            buffer); row ``[t]`` is bit-identical to what :meth:`step` gives for token ``t``.

        Raises
        ------
        ArgumentError
            ``T = 0``.
        TokenError
            An id is not an integer or outside the vocabulary (names it and its position).
        TableIOError, DeviceError
            As :meth:`step`.  On every error the history is left as it was.
        """
        self._check_open("step_many")
        host = self.host
        tok = self.model.hasher.check_tokens(token_ids)
        T = int(tok.shape[0])
        if T == 0:
            raise ArgumentError("step_many needs at least one token id, got none; the history is untouched")
        ids, before, after = host._hash_steps(tok, host.history)
        L, C = len(self.layer_ids), self.columns
        st = self._batch_staging
        if st.capacity < T:
            st = self._batch_staging = Staging(T, L * C, self.device)
        self._wait_copied(st)
        host._group.read_raw(ids.reshape(T, L * C), st.host_np[:T])
        rows = self._new_rows(T * L * C)
        host.history = after
        host._undo.extend(before)
        host.last_stats = host._group.last_stats
        host.last_row_ids = ids[-1].copy()
        self._note_exact(rows, st.host_np[:T])
        done = self._to_device(st, T, rows)
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        self._publish(rows)
        rows = rows.view(T, L, C, ROW_VALUES)
        return {lid: rows[:, i] for i, lid in enumerate(self.layer_ids)}

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` decode tokens from the history (:meth:`engram.Session.rollback`: the
        tokens of :meth:`step`, :meth:`step_many`, :meth:`step_async` and :func:`step_batch` since the
        session began or its last prefill; same errors, the history then untouched)."""
        self._check_open("rollback")
        self.host.rollback(n)

    def _reader(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="engram-gpu-read")
        return self._pool

    @_one_thread_at_a_time
    def step_async(self, token_id: int) -> StepHandle:
        """Start one decode token: layer 1's read now, layer 14's in the background.

        The first layer's 24 rows are read on the calling thread (the read
        starts as soon as the token is known) and their copy and decode queued
        on the session's stream; the other layers' reads run on the session's
        reader thread, each queuing its copy and decode when it lands.  Wait on
        ``handle.rows_ready(layer)`` before using a layer's rows: the caller's
        kernels of the layers in between run meanwhile.

        Returns
        -------
        StepHandle

        Raises
        ------
        TokenError, TableIOError, DeviceError
            As :meth:`step`, for the first layer; a later layer's read error is
            raised by its ``rows_ready(layer).wait()`` (the history then goes back
            to before the token).
        """
        self._check_open("step_async")
        host = self.host
        before = host.history.copy()
        ids = self.model.hasher.step(token_id, host.history).copy()
        C = self.columns
        rows: Dict[int, torch.Tensor] = {}
        ready: Dict[int, RowsReady] = {}

        def restore():
            host.history = before
            if host._undo and host._undo[-1] is before:
                host._undo.pop()

        def read_layer(i: int):
            lid = self.layer_ids[i]
            st = self._layer_staging[i]
            self._wait_copied(st)
            host.tables[lid].read_raw(ids[i:i + 1], st.host_np[:1])
            self._note_exact(rows[lid], st.host_np[:1])
            return self._to_device(st, 1, rows[lid].view(C, ROW_VALUES))

        try:
            for lid in self.layer_ids:
                rows[lid] = self._new_rows(C).view(C, ROW_VALUES)
            first = Future()
            first.set_result(read_layer(0))
        except BaseException:
            restore()
            raise
        ready[self.layer_ids[0]] = RowsReady(first, self.layer_ids[0], restore, self.device)
        for i in range(1, len(self.layer_ids)):
            ready[self.layer_ids[i]] = RowsReady(self._reader().submit(read_layer, i), self.layer_ids[i], restore,
                                                 self.device)
        for r in rows.values():
            self._publish(r)
        host._undo.append(before)
        host.last_row_ids = ids
        self.last_handle = StepHandle(rows, ready, ids)
        return self.last_handle

    def rows_ready(self, layer_id: int) -> RowsReady:
        """``rows_ready(layer_id)`` of the last :meth:`step_async`.

        Raises
        ------
        ArgumentError
            No :meth:`step_async` yet, or ``layer_id`` has no table.
        """
        if self.last_handle is None:
            raise ArgumentError("rows_ready: no step_async has been started on this session")
        return self.last_handle.rows_ready(layer_id)

    # -------------------------------------------------------------- prefill
    @_one_thread_at_a_time
    def prefill(self, token_ids, mask=None, *, chunk_tokens: int = 2048) -> "DevicePrefill":
        """Stream a prompt's rows to the device chunk by chunk (SPEC §8).

        Every row id is hashed up front (the history advances past the
        prompt); the session's reader thread then reads chunks of
        ``chunk_tokens`` tokens raw into two alternating pinned buffers, each
        copied and decoded on the device while the next is read.  Chunk ``k``
        of every layer comes before chunk ``k + 1``.

        Returns
        -------
        DevicePrefill
            ``wait(layer, upto)``, ``rows(layer, start, stop)``, ``progress``, ``cancel()``.

        Raises
        ------
        TokenError, MaskError, HistoryError
            As :meth:`engram.Hasher.hash` (nothing is read then).
        TableIOError
            The session is closed.
        ArgumentError
            ``chunk_tokens`` is not a positive integer.
        DeviceError
            The device ran out of memory for the prompt's rows (12 KiB a token and layer, bf16).
        """
        self._check_open("prefill")
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, (int, np.integer)) or chunk_tokens < 1:
            raise ArgumentError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        before = self.host.history.copy()
        row_ids = self.model.hasher.hash(token_ids, mask, self.host.history)
        try:
            p = DevicePrefill(self, row_ids, int(chunk_tokens))
        except BaseException:
            self.host.history = before
            raise
        self.host._undo.clear()  # rollback does not reach behind a prompt
        self._prefills = [q for q in self._prefills if not q.done] + [p]
        return p

    # -------------------------------------------------------------- mixing
    def apply(self, layer_id: int, residual: torch.Tensor, rows: torch.Tensor, mask=None,
              gates_out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Project ``rows`` and add them into ``residual`` through the gate, in place (SPEC §7), on the device.

        Runs on the current stream.  Numerics: :mod:`engram.gpu.kernels`: up to
        :data:`~engram.gpu.kernels.LANES_MAX_TOKENS` tokens (and on the CPU device) the keys and value are
        the CPU path's bits, the gates agree with it to float64 rounding; more tokens on CUDA go through
        cuBLAS (gates within ~1e-4, a key next to a bf16 rounding boundary rounding the other way); the
        residual within one bf16 rounding either way.  The first call for a layer on a device loads its weights
        there (315 MB from the file).

        Parameters
        ----------
        layer_id : int
        residual : torch.Tensor
            bfloat16 ``[T, 4, 5120]``, contiguous, on the session's device: updated in place.
        rows : torch.Tensor
            bfloat16 ``[T, 24, 256]`` on the device (from :meth:`step`, :func:`step_batch`
            (``rows[:, i]``) or a prefill); each token's 6144 values contiguous.
            Rows made elsewhere cost one host synchronisation (their f16 exactness is checked).
        mask : array_like or torch.Tensor, optional
            ``[T]``: bool or 0/1 integers on the host (the one mask rule), or a
            bool tensor on the device; False skips the token.
        gates_out : torch.Tensor, optional
            float32 ``[T, 4]``, contiguous, on the device: receives the gates (0 at masked tokens).

        Returns
        -------
        torch.Tensor
            float32 ``[T, 5, 5120]``: the keys and value.

        Raises
        ------
        ArgumentError
            ``layer_id`` has no table; a tensor of the wrong type, dtype,
            device, shape or memory layout; a bad mask; ``gates_out`` sharing
            memory with ``residual`` or ``rows``.  ``residual`` and
            ``gates_out`` are then untouched.
        TableIOError
            The session is closed.
        DeviceError
            The device ran out of memory (``residual`` untouched).
        """
        self._check_open("apply")
        layer_id = self._apply_layer(layer_id)
        untouched = "; residual and gates_out are untouched"
        width, C = self.model.info.hidden_size, self.columns
        T = self._apply_residual(residual, untouched)
        self._apply_rows(rows, T, untouched)
        mask8 = self._mask(mask, T, untouched)
        if gates_out is not None:
            self._apply_gates_out(gates_out, (residual, rows), untouched)
        w = self.weights(layer_id)
        x = rows.reshape(T, C * ROW_VALUES)
        with device_memory(self.device, f"the projection of {T} tokens"):
            x16 = x.to(torch.float16)
            kv = kernels.project(x16, x, w.kv16, exact=self._is_exact(rows, x16))
            g = gates_out if gates_out is not None else torch.empty((T, HC_STREAMS), dtype=torch.float32,
                                                                     device=self.device)
        kernels.gated_add(residual, kv.view(T, HC_STREAMS + 1, width), w.w64, self.eps, mask8, g, eps_t=w.eps_t)
        return kv.view(T, HC_STREAMS + 1, width)

    def _apply_layer(self, layer_id) -> int:
        """``layer_id`` as an int, if it is one of the session's layers (:meth:`apply`)."""
        if not isinstance(layer_id, (int, np.integer)) or isinstance(layer_id, (bool, np.bool_)):
            raise ArgumentError(f"layer must be an integer layer id (layers: {list(self.layer_ids)}), got "
                                f"{type(layer_id).__name__} {layer_id!r}; residual and gates_out are untouched")
        layer_id = int(layer_id)
        if layer_id not in self.layer_ids:
            raise ArgumentError(f"layer {layer_id} has no Engram table (layers: {list(self.layer_ids)})")
        return layer_id

    def _apply_residual(self, residual, untouched: str) -> int:
        """The token count ``T`` of ``residual``, if it is bfloat16 ``[T, 4, width]``, contiguous, without grad."""
        width = self.model.info.hidden_size
        if not isinstance(residual, torch.Tensor):
            raise ArgumentError(f"residual must be a torch.Tensor bfloat16 [T, {HC_STREAMS}, {width}] on "
                                f"{self.device}, got {type(residual).__name__}{untouched}")
        if residual.dim() != 3:
            raise ArgumentError(f"residual must have shape [T, {HC_STREAMS}, {width}], got {list(residual.shape)}"
                                f"{untouched}")
        T = residual.shape[0]
        _need_tensor("residual", residual, torch.bfloat16, self.device, (T, HC_STREAMS, width), untouched)
        if not residual.is_contiguous():
            raise ArgumentError(f"residual must be contiguous (it is updated in place){untouched}")
        if residual.requires_grad:
            raise ArgumentError(f"residual requires grad: the gated add writes it in place, outside autograd "
                                f"(pass residual.detach() or run under torch.no_grad()){untouched}")
        return T

    def _apply_rows(self, rows, T: int, untouched: str) -> None:
        """``rows`` must be bfloat16 ``[T, C, 256]``, each token's values contiguous, without grad."""
        C = self.columns
        _need_tensor("rows", rows, torch.bfloat16, self.device, (T, C, ROW_VALUES), untouched)
        if rows.stride(2) != 1 or rows.stride(1) != ROW_VALUES:
            raise ArgumentError(f"rows must hold each token's {C} x {ROW_VALUES} values contiguously "
                                f"(strides {list(rows.stride())}){untouched}")
        if rows.requires_grad:
            raise ArgumentError(f"rows require grad: the projection runs outside autograd (pass rows.detach() or "
                                f"run under torch.no_grad()){untouched}")

    def _apply_gates_out(self, gates_out, inputs, untouched: str) -> None:
        """``gates_out`` must be float32 ``[T, 4]``, contiguous, without grad, apart from ``inputs``
        (residual, rows)."""
        T = inputs[0].shape[0]
        _need_tensor("gates_out", gates_out, torch.float32, self.device, (T, HC_STREAMS), untouched)
        if not gates_out.is_contiguous():
            raise ArgumentError(f"gates_out must be contiguous{untouched}")
        if gates_out.requires_grad:
            raise ArgumentError(f"gates_out requires grad: it is written in place, outside autograd{untouched}")
        for name, other in zip(("residual", "rows"), inputs):
            if _overlap(gates_out, other):
                raise ArgumentError(f"gates_out shares memory with {name}: the gates would overwrite it while "
                                    f"it is read{untouched}")

    def _mask(self, mask, T: int, untouched: str) -> Optional[torch.Tensor]:
        if mask is None:
            return None
        if isinstance(mask, torch.Tensor):
            if mask.device != self.device and mask.device.type != "cpu":
                raise ArgumentError(f"mask is on {mask.device}, the session's device is {self.device}{untouched}")
            if mask.device == self.device and self.device.type != "cpu":
                if mask.dtype != torch.bool or tuple(mask.shape) != (T,):
                    raise ArgumentError(f"a mask on the device must be bool of shape [{T}], got "
                                        f"{str(mask.dtype)[6:]} {list(mask.shape)}{untouched}")
                return mask.to(torch.uint8)
            mask = mask.detach().numpy()
        m8 = as_mask(mask, T)
        return torch.from_numpy(np.ascontiguousarray(m8, dtype=np.uint8)).to(self.device)

    # -------------------------------------------------------------- graphs
    def capture(self, batch: int = 1, *, layers: Optional[Sequence[int]] = None):
        """The consumer of a step (copy, decode, projections, gated adds) as a replayable graph.

        See :class:`engram.gpu.graph.CapturedStep`; on the CPU the same steps run eagerly.
        """
        return CapturedStep(self, batch, layers=layers)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Cancel running prefills, stop the reader thread, close the host session (idempotent)."""
        for p in getattr(self, "_prefills", []):
            p.cancel()
        self._prefills = []
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True)
        self.host.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "host", None) is not None:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"GpuSession({self.model!r}, device={str(self.device)!r}, pinned={self.pinned})"


# ------------------------------------------------------------------ batches
def step_batch(sessions: Sequence[GpuSession], tokens) -> torch.Tensor:
    """The next token of B sessions at once: one deduplicated read, one copy, one decode.

    Each session hashes its own token with its own history; the B x 48 row
    ids go out as one batch through the first session's reads (the device's
    shared I/O engine): each distinct row read once, whatever the sessions
    share.  The raw records land in that session's pinned batch staging, are
    copied to the device in one async copy and decoded there.

    Parameters
    ----------
    sessions : sequence of GpuSession
        B open sessions of one model on one device.
    tokens : array_like of int, shape ``[B]``

    Returns
    -------
    torch.Tensor
        bfloat16 ``[B, layers, 24, 256]`` on the device (``[B, 2, 24, 256]``);
        ``rows[:, i]`` goes to :meth:`GpuSession.apply` of layer ``layer_ids[i]``.

    Raises
    ------
    ArgumentError
        Not GpuSessions of one model and device, or ``tokens`` not B integers.
    TokenError, TableIOError, DeviceError
        As :meth:`GpuSession.step`; on a failure every session's history is put back.
    """
    if isinstance(sessions, GpuSession):
        raise ArgumentError("step_batch takes a sequence of GpuSession objects (one a token), got one GpuSession")
    try:
        sessions = list(sessions)
    except TypeError:
        raise ArgumentError(f"step_batch takes a sequence of GpuSession objects, got {type(sessions).__name__}") \
            from None
    if not sessions or not all(isinstance(s, GpuSession) for s in sessions):
        raise ArgumentError("step_batch needs one or more engram.gpu.GpuSession objects")
    lead = sessions[0]
    for i, s in enumerate(sessions):
        if s.model is not lead.model or s.device != lead.device:
            raise ArgumentError(f"step_batch: session {i} is of another model or device ({s.device}) than "
                                f"session 0 ({lead.device})")
        s._check_open(f"step_batch (session {i})")
    if len({id(s) for s in sessions}) != len(sessions):
        raise ArgumentError("step_batch: a session appears twice (each holds one sequence)")
    with contextlib.ExitStack() as held:  # every session's use lock, in one order (no deadlock between batches)
        for s in sorted(sessions, key=id):
            held.enter_context(s._use_lock)
        return _step_batch(sessions, tokens)


def _step_batch(sessions: List[GpuSession], tokens) -> torch.Tensor:
    lead = sessions[0]
    tok = np.asarray(tokens)
    B = len(sessions)
    if tok.shape != (B,) or tok.dtype.kind not in "iu":
        raise ArgumentError(f"tokens must be {B} integers (one a session), got {tok.dtype} of shape {list(tok.shape)}")
    L, C = len(lead.layer_ids), lead.columns
    befores = [s.host.history.copy() for s in sessions]
    ids = np.empty((B, L, C), np.uint32)
    try:
        for b, s in enumerate(sessions):
            ids[b] = s.model.hasher.step(int(tok[b]), s.host.history)
        st = lead._batch_staging
        if st.capacity < B:
            st = lead._batch_staging = Staging(B, L * C, lead.device)
        lead._wait_copied(st)
        group = lead.host._group
        group.read_raw(ids.reshape(B, L * C), st.host_np[:B])
        rows = lead._new_rows(B * L * C)
        lead._note_exact(rows, st.host_np[:B])
        done = lead._to_device(st, B, rows)  # a failed copy or decode after a good read: the histories go back too
    except BaseException:
        for s, h in zip(sessions, befores):
            s.host.history = h
        raise
    for b, s in enumerate(sessions):
        s.host.last_row_ids = ids[b].copy()
        s.host._undo.append(befores[b])
    lead.host.last_stats = group.last_stats
    if done is not None:
        torch.cuda.current_stream(lead.device).wait_event(done)
    lead._publish(rows)
    for s in sessions[1:]:
        s._note_exact(rows, st.host_np[:B])
    return rows.view(B, L, C, ROW_VALUES)


# ------------------------------------------------------------------ prefill
class DevicePrefill:
    """A prompt's rows streamed to the device (:meth:`GpuSession.prefill`).

    Attributes
    ----------
    tokens : int
    row_ids : numpy.ndarray
        uint32 ``[T, layers, 24]``.
    progress : dict[int, int]
        Layer id -> tokens whose rows are on the device (copy and decode queued).
    """

    def __init__(self, session: GpuSession, row_ids: np.ndarray, chunk_tokens: int):
        self.session = session
        self.row_ids = row_ids
        self.tokens = int(row_ids.shape[0])
        self.chunk_tokens = chunk_tokens
        self.layer_ids = session.layer_ids
        C = session.columns
        dev = session.device
        with device_memory(dev, f"the rows of a {self.tokens}-token prompt"):
            self._rows = {lid: torch.empty((self.tokens, C, ROW_VALUES), dtype=torch.bfloat16, device=dev)
                          for lid in self.layer_ids}
        slot = max(1, min(chunk_tokens, self.tokens))
        self._slots = [Staging(slot, C, dev) for _ in range(2)]
        self.progress = {lid: 0 for lid in self.layer_ids}
        self._events: Dict[int, List[tuple]] = {lid: [] for lid in self.layer_ids}
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        self._cancelled = False
        self.done = self.tokens == 0
        if not self.done:
            self._future = session._reader().submit(self._run)

    def _run(self) -> None:
        s = self.session
        k = 0
        try:
            for a in range(0, self.tokens, self.chunk_tokens):
                b = min(self.tokens, a + self.chunk_tokens)
                for li, lid in enumerate(self.layer_ids):
                    if self._cancelled or s.closed:
                        raise PrefetchCancelled("the prefill was cancelled or its session closed")
                    st = self._slots[k % 2]
                    k += 1
                    s._wait_copied(st)
                    s.host.tables[lid].read_raw(self.row_ids[a:b, li, :], st.host_np[:b - a])
                    s._note_exact(self._rows[lid], st.host_np[:b - a])
                    ev = s._to_device(st, b - a, self._rows[lid][a:b].view(-1, ROW_VALUES))
                    with self._cond:
                        self._events[lid].append((b, ev))
                        self.progress[lid] = b
                        self._cond.notify_all()
        except BaseException as exc:  # handed to the waiters
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self.done = True
            self._cond.notify_all()

    def _layer(self, layer_id) -> int:
        return need_layer(layer_id, self.layer_ids)

    def wait(self, layer_id: int, upto: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Block until tokens ``[0, upto)`` of ``layer_id`` are on the device; order the current stream after them.

        Raises
        ------
        TableIOError, RowRangeError, DecodeError
            The read failed; PrefetchCancelled: cancelled or closed first.
        ArgumentError
            Unknown layer, or ``upto`` outside ``[0, tokens]``.
        TimeoutError
            ``timeout`` seconds passed.
        """
        lid = self._layer(layer_id)
        upto = self.tokens if upto is None else need_int("upto", upto, 0, self.tokens)
        with self._cond:
            if not self._cond.wait_for(lambda: self.progress[lid] >= upto or self._error is not None, timeout):
                raise TimeoutError(f"layer {lid}: {self.progress[lid]} of {upto} tokens after {timeout} s")
            if self.progress[lid] < upto:
                raise self._error
            events = [ev for end, ev in self._events[lid] if ev is not None]
        if self.session.device.type == "cuda":
            cur = torch.cuda.current_stream(self.session.device)
            for ev in events:
                cur.wait_event(ev)

    def rows(self, layer_id: int, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """bfloat16 ``[stop - start, 24, 256]`` on the device (waits for them first).

        Raises
        ------
        ArgumentError
            Unknown layer, or not ``0 <= start <= stop <= tokens`` (no negative or reversed ranges).
        """
        lid = self._layer(layer_id)
        stop = self.tokens if stop is None else need_int("stop", stop, 0, self.tokens)
        start = need_int("start", start, 0, stop)
        self.wait(lid, stop)
        return self._rows[lid][start:stop]

    def cancel(self) -> None:
        """Stop after the chunk being read (waiters then get PrefetchCancelled)."""
        self._cancelled = True


# ------------------------------------------------------------------ the entry point
def session_factory(model, device, **overrides) -> GpuSession:
    """``EngramModel.session(device=...)``'s implementation (entry point ``engram.sessions: torch``)."""
    return GpuSession(model, device, **overrides)

