"""Where rows go on their way to the device: the device itself, page-locked staging, the copy stream.

The reader writes raw 264-byte records (:meth:`engram.TableGroup.read_raw`)
straight into a page-locked (pinned) host buffer allocated by torch
(``pin_memory=True``) and handed to the reader as its ``out`` through a
zero-copy NumPy view; one asynchronous host-to-device copy of the raw records
on a stream of the session's own then feeds the decode kernel.  No pageable
intermediate, no decode on the host.

On the ``cpu`` device nothing is pinned (there is no transfer: the "device"
buffer is host memory, and the copy is a plain ``copy_``); the same code runs,
which is how the logic is tested without a GPU.

GPUDirect Storage is not used: 264-byte rows lie far below the transfer size
at which it pays, and where it was probed (kvikio on the lent H200) it ran in
compatibility mode only.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Tuple, Union

import numpy as np
import torch

from ..codec import ROW_BYTES
from ..errors import ArgumentError, DeviceError

__all__ = ["resolve_device", "Staging", "device_memory", "new_stream", "pinned"]


_OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # torch.OutOfMemoryError from 2.2


def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """The torch device ``device`` names, checked to exist.

    Parameters
    ----------
    device : str or torch.device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (any string torch parses).

    Returns
    -------
    torch.device
        With an index for CUDA (``cuda`` -> ``cuda:<current>``).

    Raises
    ------
    DeviceError
        The string is not a device, CUDA is not available in this torch
        build or on this machine, the CUDA index is past the device count, or
        the device type is not ``cpu`` or ``cuda``.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"{device!r} is not a torch device ({exc})", device=str(device)) from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise DeviceError(f"device {str(dev)!r}: engram.gpu runs on 'cpu' and 'cuda' devices", device=str(dev))
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device or driver is present"
        raise DeviceError(f"device {str(dev)!r} does not exist: {why} (torch {torch.__version__})", device=str(dev))
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        raise DeviceError(f"device {str(dev)!r} does not exist: this machine has {count} CUDA device(s)",
                          device=str(dev))
    return torch.device("cuda", index)


@contextlib.contextmanager
def device_memory(device: torch.device, what: str):
    """Turn a device out-of-memory error inside the block into :class:`DeviceError` naming ``what``."""
    try:
        yield
    except _OOM as exc:
        raise DeviceError(f"{device}: out of memory allocating {what} ({str(exc).splitlines()[0]})",
                          device=str(device)) from None
    except RuntimeError as exc:  # the CPU allocator says "can't allocate memory"
        low = str(exc).lower()
        if "out of memory" not in low and "can't allocate memory" not in low:
            raise
        raise DeviceError(f"{device}: out of memory allocating {what} ({str(exc).splitlines()[0]})",
                          device=str(device)) from None


def new_stream(device: torch.device) -> Optional["torch.cuda.Stream"]:
    """A CUDA stream of the session's own on ``device``; None on the CPU."""
    return torch.cuda.Stream(device=device) if device.type == "cuda" else None


def pinned(shape: Tuple[int, ...], device: torch.device) -> Tuple[torch.Tensor, np.ndarray]:
    """A uint8 host tensor of ``shape``, page-locked when ``device`` is CUDA, with its NumPy view (shared)."""
    with device_memory(device, f"{int(np.prod(shape))} bytes of page-locked staging"):
        t = torch.empty(shape, dtype=torch.uint8, pin_memory=device.type == "cuda")
    return t, t.numpy()


class Staging:
    """Raw records of up to ``capacity`` tokens x ``columns`` rows: a pinned host buffer and its device twin.

    ``host`` / ``host_np``: uint8 ``[capacity, columns, 264]`` page-locked (CUDA) host memory, the
    reader's ``out``.  ``dev``: the same shape on the device.  :meth:`upload` copies the first
    ``n`` tokens asynchronously on ``stream``.
    """

    def __init__(self, capacity: int, columns: int, device: torch.device):
        if capacity < 1:
            raise ArgumentError(f"staging capacity must be >= 1 token, got {capacity}")
        self.capacity, self.columns, self.device = int(capacity), int(columns), device
        self.host, self.host_np = pinned((self.capacity, self.columns, ROW_BYTES), device)
        with device_memory(device, f"{self.host.numel()} bytes of device staging"):
            self.dev = torch.empty_like(self.host, device=device) if device.type != "cpu" else \
                torch.empty_like(self.host)
        self.pinned = bool(self.host.is_pinned()) if device.type == "cuda" else False

    def upload(self, n: int, stream: Optional["torch.cuda.Stream"]) -> torch.Tensor:
        """Copy tokens ``[0, n)`` to the device (async on ``stream`` for CUDA); the device view ``[n, columns, 264]``."""
        src, dst = self.host[:n], self.dev[:n]
        if stream is None:
            dst.copy_(src)
        else:
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
        return dst
