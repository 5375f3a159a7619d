"""The consumer of a decode step as a CUDA graph: fixed device buffers, replayed once a layer's rows are read.

Per Engram layer one graph holds the whole consumer: the async copy of the
raw records from the layer's pinned staging buffer, the decode kernel, the
projection (F16 weights resident; :func:`engram.gpu.kernels.projection_path`) and the gated add into the fixed
residual buffer ``residual[layer]`` (bf16 ``[B, 4, 5120]``), with the gates in
``gates[layer]``.  The host's read fills the staging buffer; launching the
graph after the read releases the copy (stream order), so nothing in the graph
waits on the host.  :meth:`CapturedStep.begin` reads layer 1 at once and
launches its graph, and reads layer 14 on a background thread;
:meth:`CapturedStep.finish` launches layer 14's graph once its read is in,
while the caller's kernels of layers 2-13 keep the device busy.

Before a replay the host checks that the records' scales keep the f16
projection exact (:data:`engram.gpu.kernels.F16_EXACT_SCALES`); a step whose
records do not runs the same consumer eagerly on the path for such records.  On the CPU
there are no graphs: the same sequence runs eagerly (how the logic is tested).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from .._checks import need_layer
from ..codec import ROW_BYTES, ROW_VALUES
from ..errors import ArgumentError
from ..gguf import HC_STREAMS
from . import kernels
from .staging import Staging, device_memory

__all__ = ["CapturedStep", "WARMUP_RUNS"]

#: Eager runs of a layer's consumer before its capture (Triton compiles, cuBLAS picks its kernels).
WARMUP_RUNS = 2


class CapturedStep:
    """A decode step's consumer for B sessions on fixed device buffers, one CUDA graph a layer.

    Parameters
    ----------
    sessions : sequence of GpuSession
        B open sessions of one model on one device (``GpuSession.capture(1)`` passes itself).
    layers : sequence of int, optional
        Engram layers to capture (default all).

    Attributes
    ----------
    residual : dict[int, torch.Tensor]
        Layer id -> bfloat16 ``[B, 4, 5120]``: the residual each replay adds into (write
        the step's residual here; read it back after :meth:`finish`).
    gates : dict[int, torch.Tensor]
        Layer id -> float32 ``[B, 4]``.
    rows : dict[int, torch.Tensor]
        Layer id -> bfloat16 ``[B, 24, 256]``: the decoded rows of the last step.
    graphs : dict[int, torch.cuda.CUDAGraph]
        Empty on the CPU.
    eager_steps : int
        Steps run eagerly on the exact path (scales outside the f16-exact range).

    Raises
    ------
    ArgumentError
        No sessions, a session twice or one that is not a GpuSession, sessions of another model or
        device; no layers, an unknown layer or one twice.
    DeviceError
        Out of memory on the device.
    """

    def __init__(self, sessions, batch: Optional[int] = None, *, layers: Optional[Sequence[int]] = None):
        if not isinstance(sessions, (list, tuple)):
            sessions = [sessions]
        sessions = list(sessions)
        if not sessions:
            raise ArgumentError("CapturedStep needs one or more sessions")
        for i, s in enumerate(sessions):
            if not hasattr(s, "_check_open") or not hasattr(s, "device"):  # a GpuSession (not imported: a cycle)
                raise ArgumentError(f"CapturedStep: session {i} is a {type(s).__name__}, not an engram.gpu."
                                    f"GpuSession (make one with model.session(device=...))")
        if len({id(s) for s in sessions}) != len(sessions):
            raise ArgumentError("CapturedStep: a session appears twice (each holds one sequence)")
        if batch is not None and batch != len(sessions):
            raise ArgumentError(f"a captured step of batch {batch} needs {batch} sessions, got {len(sessions)} "
                                f"(pass them as engram.gpu.CapturedStep(sessions))")
        lead = sessions[0]
        for i, s in enumerate(sessions):
            if s.model is not lead.model or s.device != lead.device:
                raise ArgumentError(f"CapturedStep: session {i} is of another model or device than session 0")
            s._check_open("capture")
        self.sessions = sessions
        self.device = dev = lead.device
        self.batch = B = len(sessions)
        self.layer_ids = tuple(lead.layer_ids if layers is None else
                               (need_layer(x, lead.layer_ids) for x in layers))
        if not self.layer_ids:
            raise ArgumentError(f"CapturedStep needs one or more layers (layers: {list(lead.layer_ids)})")
        if len(set(self.layer_ids)) != len(self.layer_ids):
            raise ArgumentError(f"CapturedStep: a layer appears twice in {list(self.layer_ids)} (its gated add "
                                f"would run twice a step)")
        C, W = lead.columns, lead.model.info.hidden_size
        self.columns, self.width = C, W
        self.weights = {lid: lead.weights(lid) for lid in self.layer_ids}
        self.staging = {lid: Staging(B, C, dev) for lid in self.layer_ids}
        with device_memory(dev, f"the fixed buffers of a batch-{B} step"):
            self.rows = {lid: torch.empty((B, C, ROW_VALUES), dtype=torch.bfloat16, device=dev)
                         for lid in self.layer_ids}
            self._x16 = {lid: torch.empty((B, C * ROW_VALUES), dtype=torch.float16, device=dev)
                         for lid in self.layer_ids}
            self._kv = {lid: torch.empty((B, (HC_STREAMS + 1) * W), dtype=torch.float32, device=dev)
                        for lid in self.layer_ids}
            self.residual = {lid: torch.zeros((B, HC_STREAMS, W), dtype=torch.bfloat16, device=dev)
                             for lid in self.layer_ids}
            self.gates = {lid: torch.zeros((B, HC_STREAMS), dtype=torch.float32, device=dev)
                          for lid in self.layer_ids}
            self.mask8 = torch.ones(B, dtype=torch.uint8, device=dev)
        self.graphs: Dict[int, "torch.cuda.CUDAGraph"] = {}
        self._launched: Dict[int, Optional["torch.cuda.Event"]] = {lid: None for lid in self.layer_ids}
        self._exact: Dict[int, bool] = {lid: True for lid in self.layer_ids}
        self._pending: Dict[int, Future] = {}
        self._ids: Optional[np.ndarray] = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self.eager_steps = 0
        if dev.type == "cuda":
            with device_memory(dev, "the step's CUDA graphs"):
                self._capture()

    # -------------------------------------------------------------- the consumer of one layer
    def _body(self, lid: int, exact: bool = True) -> None:
        st, w = self.staging[lid], self.weights[lid]
        B, C, W = self.batch, self.columns, self.width
        if self.device.type == "cuda":
            st.dev.copy_(st.host, non_blocking=True)
        else:
            st.dev.copy_(st.host)
        rows = self.rows[lid].view(B * C, ROW_VALUES)
        kernels.decode_raw(st.dev.view(B * C, ROW_BYTES), rows, self._x16[lid].view(B * C, ROW_VALUES))
        kernels.project(self._x16[lid], rows.view(B, C * ROW_VALUES), w.kv16, exact=exact, out=self._kv[lid])
        kernels.gated_add(self.residual[lid], self._kv[lid].view(B, HC_STREAMS + 1, W), w.w64,
                          self.sessions[0].eps, self.mask8, self.gates[lid], eps_t=w.eps_t)

    def _capture(self) -> None:
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        saved = {lid: self.residual[lid].clone() for lid in self.layer_ids}
        with torch.cuda.stream(side):
            for lid in self.layer_ids:
                for _ in range(WARMUP_RUNS):
                    self._body(lid)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        for lid in self.layer_ids:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._body(lid)
            self.graphs[lid] = g
            self.residual[lid].copy_(saved[lid])
        torch.cuda.synchronize(self.device)

    # -------------------------------------------------------------- a step
    def _reader(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="engram-gpu-graph-read")
        return self._pool

    def _read(self, i: int, lid: int) -> None:
        st = self.staging[lid]
        ev = self._launched[lid]
        if ev is not None:
            ev.synchronize()  # the last replay's copy out of the staging buffer is done
        self.sessions[0].host.tables[lid].read_raw(self._ids[:, i, :], st.host_np)
        lo, hi = kernels.F16_EXACT_SCALES
        s = st.host_np[..., ROW_VALUES:]
        self._exact[lid] = bool(((s >= lo) & (s <= hi)).all())

    def launch(self, lid: int) -> None:
        """Replay layer ``lid``'s graph on the current stream (its staging holds the step's records).

        Raises
        ------
        ArgumentError
            ``lid`` is not a captured layer.
        """
        lid = need_layer(lid, self.layer_ids)
        if self.graphs and self._exact[lid]:
            self.graphs[lid].replay()
        else:
            if not self._exact[lid]:
                self.eager_steps += 1
            self._body(lid, exact=self._exact[lid])
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._launched[lid] = ev

    def begin(self, tokens) -> None:
        """Hash the step's tokens, read the first layer and launch its graph, start the others' reads.

        Parameters
        ----------
        tokens : int or array_like of int, shape ``[B]``

        Raises
        ------
        TokenError, TableIOError, RowRangeError, DecodeError
            As :meth:`GpuSession.step`; every history is then put back.
        """
        tok = np.atleast_1d(np.asarray(tokens))
        if tok.shape != (self.batch,) or tok.dtype.kind not in "iu":
            raise ArgumentError(f"tokens must be {self.batch} integers, got {tok.dtype} {list(tok.shape)}")
        with contextlib.ExitStack() as held:  # the sessions' use locks (GpuSession.step's), in one order
            for s in sorted(self.sessions, key=id):
                held.enter_context(s._use_lock)
            self._begin(tok)

    def _begin(self, tok: np.ndarray) -> None:
        for s in self.sessions:
            s._check_open("step")
        befores = [s.host.history.copy() for s in self.sessions]
        lead = self.sessions[0]
        all_ids = lead.layer_ids
        ids = np.empty((self.batch, len(all_ids), self.columns), np.uint32)
        try:
            for b, s in enumerate(self.sessions):
                ids[b] = s.model.hasher.step(int(tok[b]), s.host.history)
            self._ids = ids[:, [all_ids.index(lid) for lid in self.layer_ids], :]
            self._read(0, self.layer_ids[0])
        except BaseException:
            for s, h in zip(self.sessions, befores):
                s.host.history = h
            raise
        self.launch(self.layer_ids[0])
        self._befores = befores
        self._pending = {lid: self._reader().submit(self._read, i, lid)
                         for i, lid in enumerate(self.layer_ids) if i > 0}

    def finish(self, layer_id: Optional[int] = None) -> None:
        """Wait for a later layer's read (default every pending one) and launch its graph.

        Raises
        ------
        TableIOError, RowRangeError, DecodeError
            That read failed; every history is put back to before the step.
        ArgumentError
            ``layer_id`` is not a captured layer.
        """
        lids = list(self._pending) if layer_id is None else [need_layer(layer_id, self.layer_ids)]
        for lid in lids:
            fut = self._pending.pop(lid, None)
            if fut is None:
                continue
            try:
                fut.result()
            except BaseException:
                for s, h in zip(self.sessions, self._befores):
                    s.host.history = h
                raise
            self.launch(lid)

    def step(self, tokens) -> None:
        """:meth:`begin` then :meth:`finish`: the whole consumer of one step (asynchronous on the device)."""
        self.begin(tokens)
        self.finish()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
