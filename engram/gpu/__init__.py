"""engram on an accelerator: rows read into page-locked memory, decoded, projected and gated on a torch device.

An optional extra (``pip install 'engram[gpu]'``: torch >= 2.1, and triton >= 3.0 on Linux x86_64);
``engram`` itself never imports torch.  Importing this package without torch raises
:class:`engram.DeviceError` naming the extra.

- :class:`GpuSession` -- a decode session whose rows land on a device (``EngramModel.session(device=...)``
  makes one); ``step``, ``step_async`` + ``rows_ready``, ``apply``, ``prefill``, ``capture``
- :func:`step_batch` -- one deduplicated read and one copy for B sessions' next tokens
- :mod:`engram.gpu.kernels` -- decode, projection and gated add (Triton, with torch twins)
- :mod:`engram.gpu.staging` -- the device, page-locked staging buffers, the copy stream
- :mod:`engram.gpu.graph` -- the consumer of a step as a CUDA graph
"""

from __future__ import annotations

from ..errors import DeviceError

try:
    import torch  # noqa: F401
except ImportError as exc:  # torch is the extra engram[gpu]
    raise DeviceError(f"engram.gpu needs PyTorch, which is not installed ({exc}): install the extra with "
                      f"pip install 'engram[gpu]' (torch>=2.1, triton>=3.0 on Linux x86_64)") from None

from . import kernels  # noqa: E402
from .staging import resolve_device  # noqa: E402
from .session import DevicePrefill, GpuSession, StepHandle, session_factory, step_batch  # noqa: E402
from .graph import CapturedStep  # noqa: E402

__all__ = ["GpuSession", "StepHandle", "DevicePrefill", "CapturedStep", "step_batch", "session_factory",
           "resolve_device", "kernels", "DeviceError"]
