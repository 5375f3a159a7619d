"""Small real file systems for the tests of failures to write: a tmpfs of a few pages (a full disk) and a
read-only one.  Mounting needs root and the right to mount; without it the tests using them skip."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"8k"``) mounted at ``where`` (made), read-only when asked; unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root and the right "
                    "to mount")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
