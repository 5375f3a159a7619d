"""Fault injection for the reliability tests.

- :func:`build_shim`: compiles ``shim.c`` (an ``LD_PRELOAD`` library that makes
  ``pread``/``preadv2`` fail with EIO or EINTR, return short or end early, and
  io_uring reads complete with -EINVAL, by wrapping the ``syscall()`` through
  which the engine enters its ring) with the system C compiler; :func:`run_child`
  runs Python code in a child process with it preloaded.
- :class:`FaultMount`: a FUSE file system (``fusefs.py``, its own process) that
  serves a directory read-only and injects EIO, EINTR, short reads and delays
  into reads of chosen byte ranges.  The faults come back through the kernel,
  so they reach every backend, io_uring included.  Device-mapper's ``error``
  target would do the same for EIO, but needs a kernel with device-mapper.
- Process probes: open descriptors, threads, resident memory.
- :func:`backend_params`: the read backends of this build as pytest parameters, each
  skipped with the reason when it cannot start and read on this machine now (the
  io_uring ring refused by the kernel, a sysctl, seccomp or ``ENGRAM_DISABLE_IO_URING``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from engram.backends import available_backends, probe_backends

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent

#: Fault modes of the shim (``engram_fault_set``).
SHIM_EIO, SHIM_EINTR, SHIM_SHORT, SHIM_EOF, SHIM_RING_EINVAL = 1, 2, 3, 4, 5


# ---------------------------------------------------------------- backends
def backend_params(names=None) -> list:
    """``names`` (default: every backend of this build) as ``pytest.param``s; a backend that
    does not start and read here is skipped with the reason :func:`engram.backends.probe_backends` gives."""
    status = probe_backends()
    out = []
    for name in names or available_backends():
        st = status[name]
        marks = () if st.usable else pytest.mark.skip(reason=f"{name} unusable here: {st.reason}")
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def usable(names=None) -> tuple:
    """The backends among ``names`` (default: all of this build) that start and read here."""
    status = probe_backends()
    return tuple(n for n in (names or available_backends()) if status[n].usable)


# ---------------------------------------------------------------- process probes
def fd_count() -> int:
    """Open descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    """Threads of this process."""
    return len(os.listdir("/proc/self/task"))


def rss_bytes() -> int:
    """Resident set size of this process (bytes)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


# ---------------------------------------------------------------- LD_PRELOAD shim
_SHIM_CACHE: dict = {}


def build_shim(outdir) -> Path:
    """Compile ``shim.c`` into ``outdir`` (once per directory); returns the shared library's path.

    Raises ``RuntimeError`` (with the compiler's output) when no C compiler works.
    """
    out = Path(outdir) / "libengramfault.so"
    if _SHIM_CACHE.get("path") == out and out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(HERE / "shim.c"), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"compiling the fault shim failed:\n{r.stderr}")
    _SHIM_CACHE["path"] = out
    return out


def preloaded_shim():
    """In a child started by :func:`run_child` with the shim: its handle, with argument types set.

    ``shim.engram_fault_set(mode, suffix: bytes, lo, hi, every, limit, granule)``,
    ``shim.engram_fault_fired()``, ``shim.engram_fault_matched()``.
    """
    import ctypes

    shim = ctypes.CDLL(os.environ["LD_PRELOAD"])
    shim.engram_fault_set.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_ulonglong,
                                      ctypes.c_long, ctypes.c_long, ctypes.c_long]
    shim.engram_fault_set.restype = ctypes.c_int
    shim.engram_fault_fired.restype = ctypes.c_long
    shim.engram_fault_matched.restype = ctypes.c_long
    return shim


def run_child(code: str, *, preload: Optional[Path] = None, timeout: float = 120.0, env: Optional[dict] = None):
    """Run ``code`` in a child Python (the repository on its path, ``preload`` in ``LD_PRELOAD``).

    The child prints one JSON document as its last line of output; returns it.
    A child that crashes, hangs past ``timeout`` or prints no JSON fails the
    calling test with its output.
    """
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent)] + [p for p in [e.get("PYTHONPATH")] if p])
    if preload is not None:
        e["LD_PRELOAD"] = str(preload)
    e.update(env or {})
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=e)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"child process hung for {timeout} s:\n{exc.stdout}\n{exc.stderr}") from None
    if r.returncode != 0:
        raise AssertionError(f"child process failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if not lines:
        raise AssertionError(f"child process printed nothing:\n{r.stderr}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------- FUSE
def fuse_unavailable() -> Optional[str]:
    """Why a FUSE mount cannot be made here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3"
    try:
        importlib.import_module("mfusepy")  # a probe: importing it loads libfuse (OSError when absent)
    except (ImportError, OSError) as exc:
        return f"mfusepy/libfuse not importable: {exc}"
    return None


class FaultMount:
    """A :mod:`tests.faults.fusefs` mount of ``root`` at ``mountpoint`` (both directories).

    Use as a context manager; it unmounts and stops the file system process on
    exit, even when the test failed (lazy unmount if descriptors are still open).
    """

    def __init__(self, root, mountpoint, workdir):
        self.root = Path(root)
        self.mountpoint = Path(mountpoint)
        self.control = Path(workdir) / "faults.json"
        self.stats_path = Path(workdir) / "fault-stats.json"
        self.log = Path(workdir) / "fusefs.log"
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "FaultMount":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.set_rules([])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
        env.pop("LD_PRELOAD", None)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.fusefs", str(self.root), str(self.mountpoint), str(self.control),
                 str(self.stats_path)], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"FUSE mount did not come up: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def set_rules(self, rules) -> None:
        """Replace the fault rules (see :mod:`tests.faults.fusefs`); takes effect at the next read."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rules": list(rules)}))
        os.replace(tmp, self.control)

    def stats(self) -> dict:
        """Faults fired per mode and reads served, as the file system last wrote them."""
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _stop(self) -> None:
        if os.path.ismount(self.mountpoint):
            for cmd in (["fusermount3", "-u", str(self.mountpoint)], ["umount", str(self.mountpoint)],
                        ["umount", "-l", str(self.mountpoint)]):
                if shutil.which(cmd[0]) is None:
                    continue
                if subprocess.run(cmd, capture_output=True).returncode == 0:
                    break
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
                if os.path.ismount(self.mountpoint):
                    subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
            self.proc = None
