"""A FUSE file system that serves a directory read-only and injects faults into reads.

Run as a separate process (``python -m tests.faults.fusefs ROOT MOUNTPOINT CONTROL STATS``);
:class:`faults.FaultMount` starts, waits for and unmounts it.  Every file of ROOT
appears under MOUNTPOINT, opened with ``direct_io`` so that each read of the
engine reaches this process (no page cache in between, short replies reach
the caller as short reads).  Because the faults come back through the kernel,
they reach every read backend: serial and pooled ``pread`` and io_uring alike.

CONTROL is a JSON file, re-read whenever it changes::

    {"rules": [{"name": "t.bin", "lo": 0, "hi": 1e18, "mode": "eio",
                "every": 1, "limit": -1, "seconds": 0.0}]}

A rule matches reads of file ``name`` that overlap bytes ``[lo, hi)``; it
fires on every ``every``-th match, at most ``limit`` times (-1: no limit).
Modes: ``eio`` and ``eintr`` (the read fails with that errno), ``short``
(half the bytes, at least one 512-byte block when more than one was asked),
``delay`` (sleep ``seconds``, then serve the read).  STATS receives the
counts of fired faults per mode (JSON, replaced atomically after each one).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time

import mfusepy

_ERRNO = {"eio": errno.EIO, "eintr": errno.EINTR}


class FaultFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, root: str, control: str, stats: str):
        self.root = root
        self.control = control
        self.stats_path = stats
        self.lock = threading.Lock()
        self.rules = []
        self.counts = {"reads": 0}
        self.stamp = None

    # --------------------------------------------------------------- faults
    def _reload(self) -> None:
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self.stamp:
            return
        rules = []
        if stamp is not None:
            with open(self.control) as f:
                rules = json.load(f).get("rules", [])
            for r in rules:
                r.setdefault("lo", 0)
                r.setdefault("hi", 1 << 62)
                r.setdefault("every", 1)
                r.setdefault("limit", -1)
                r.setdefault("seconds", 0.0)
                r["matched"] = 0
                r["fired"] = 0
        self.rules = rules
        self.stamp = stamp

    def _dump(self) -> None:
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.counts, f)
        os.replace(tmp, self.stats_path)

    def _fault(self, name: str, size: int, offset: int):
        """The rule that fires for this read, or None (under the lock)."""
        with self.lock:
            self._reload()
            self.counts["reads"] += 1
            for r in self.rules:
                if r["name"] != name or offset + size <= r["lo"] or offset >= r["hi"]:
                    continue
                if r["mode"] == "short" and size <= 1:
                    continue
                r["matched"] += 1
                if r["matched"] % r["every"] or (0 <= r["limit"] <= r["fired"]):
                    continue
                r["fired"] += 1
                self.counts[r["mode"]] = self.counts.get(r["mode"], 0) + 1
                self._dump()
                return dict(r)
        return None

    # ----------------------------------------------------------- operations
    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise mfusepy.FuseOSError(exc.errno) from None
        out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                           "st_atime", "st_mtime", "st_ctime")}
        out["st_mode"] &= ~0o222  # read-only
        return out

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._real(path))

    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR):
            raise mfusepy.FuseOSError(errno.EROFS)
        try:
            fi.fh = os.open(self._real(path), os.O_RDONLY)
        except OSError as exc:
            raise mfusepy.FuseOSError(exc.errno) from None
        fi.direct_io = 1
        return 0

    def read(self, path, size, offset, fi):
        rule = self._fault(os.path.basename(path), size, offset)
        if rule is not None:
            mode = rule["mode"]
            if mode in _ERRNO:
                raise mfusepy.FuseOSError(_ERRNO[mode])
            if mode == "delay":
                time.sleep(rule["seconds"])
            elif mode == "short":
                n = size // 2 // 512 * 512 or max(1, size // 2)
                return os.pread(fi.fh, n, offset)
        return os.pread(fi.fh, size, offset)

    def release(self, path, fi):
        os.close(fi.fh)
        return 0

    def statfs(self, path):
        st = os.statvfs(self.root)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_namemax")}


def main(argv) -> None:
    root, mountpoint, control, stats = argv
    fs = FaultFS(root, control, stats)
    fs._dump()
    mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=False, raw_fi=True, ro=True,
                 fsname="engram-faults")


if __name__ == "__main__":
    main(sys.argv[1:])
