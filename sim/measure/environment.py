"""Where a measurement runs: the machine, the model file read, and building that file when it is missing."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Union

import numpy as np

from engram import Layout, read_model
from engram.errors import ArgumentError
from engram.synth import Fill, ModelShape, build_model

from .configs import DEFAULT_SCALE

try:  # optional: names the BLAS library and its threads
    from threadpoolctl import threadpool_info
except ImportError:  # pragma: no cover
    threadpool_info = None

__all__ = ["ensure_model", "file_info", "machine_info"]


def machine_info() -> dict:
    """CPU, cores, memory, kernel, Python/NumPy and BLAS of this machine."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    info = {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "memory_bytes": mem,
            "system": platform.system(), "kernel": platform.release(), "python": platform.python_version(),
            "numpy": np.__version__, "hostname": platform.node()}
    if threadpool_info is not None:
        try:
            info["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "num_threads")}
                            for d in threadpool_info()]
        except Exception:  # pragma: no cover - a BLAS it cannot read
            pass
    try:
        info["loadavg"] = list(os.getloadavg())
    except OSError:  # pragma: no cover
        pass
    return info


def file_info(info) -> dict:
    """Path, size, mtime, block device and tables of a model file (``info``: :class:`engram.ModelInfo`)."""
    st = os.stat(info.path)
    dev = os.major(st.st_dev), os.minor(st.st_dev)
    return {"path": str(Path(info.path).resolve()), "size": st.st_size, "mtime": st.st_mtime,
            "device": f"{dev[0]}:{dev[1]}",
            "tables": [{"layer": int(l), "offset": int(t.offset), "rows": int(t.rows), "path": str(t.path)}
                       for l, t in sorted(info.tables.items())]}


def ensure_model(path: Union[str, os.PathLike], scale: float = DEFAULT_SCALE, *, build: bool = True,
                 progress: bool = True, **build_kw) -> Path:
    """The model file at ``path``, built with :func:`engram.synth.build_model` when missing.

    An existing file is reused when its tables have the rows of
    ``Layout.deepseek_v41_flash(scale=scale)``.

    Raises
    ------
    ArgumentError
        The file exists with another layout, or is missing and ``build`` is false.
    FormatError
        The file is not a model in the real format.
    """
    path = Path(path)
    want = [int(r) for r in Layout.deepseek_v41_flash(scale=scale).rows]
    if path.exists():
        info = read_model(path)
        got = [int(info.tables[l].rows) for l in sorted(info.tables)]
        if got != want:
            raise ArgumentError(f"{path}: tables have {got} rows, not the {want} of scale {scale}; "
                                "give its scale with --scale or another --model path")
        return path
    if not build:
        raise ArgumentError(f"{path}: no model file (build one with engram synth, or drop --no-build)")
    path.parent.mkdir(parents=True, exist_ok=True)
    build_model(path, ModelShape(scale=scale), Fill(**build_kw), progress=progress)
    return path
