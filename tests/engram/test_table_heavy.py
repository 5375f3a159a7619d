"""Heavy storage test: reading twice the machine's RAM leaves the page cache and RSS flat.

Marked ``heavy`` (run in CI with ``-m heavy``).  The table is a sparse file of
the released V4.1 size (384,006,168 rows, 94 GiB of holes), so the bytes pass
through the whole read path without needing the disk space; a buffered reader
would fill the page cache with them.
"""

from __future__ import annotations

import numpy as np
import pytest

from engram import Table
from tests.faults import usable

pytestmark = pytest.mark.heavy

ROWS = 384_006_168


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


@pytest.mark.parametrize("backend", usable(("io_uring", "pread"))[:1])  # the first that starts here
def test_twice_ram_leaves_cache_and_rss_flat(tmp_path, backend):
    path = tmp_path / "sparse-table.bin"
    offset = 162_955_640_832  # where the released model's first table starts
    with open(path, "wb") as f:
        f.truncate(offset + ROWS * 264)
    target = 2 * _meminfo("MemTotal")
    rng = np.random.default_rng(0)
    out = np.empty((2048, 24, 256), np.float32)
    with Table(path, offset, ROWS, backend=backend, readers=32, block_size=4096) as t:
        assert t.direct
        t.read_batch(rng.integers(0, ROWS, (2048, 24), dtype=np.uint32), out=out)  # warm up
        cached0, rss0 = _meminfo("Cached"), _rss()
        while t.stats.bytes_read < target:
            t.read_batch(rng.integers(0, ROWS, (2048, 24), dtype=np.uint32), out=out)
        cached1, rss1 = _meminfo("Cached"), _rss()
        read = t.stats.bytes_read
    assert read >= target
    assert np.all(out == 0.0)  # holes decode to zeros
    print(f"read {read / 2**30:.1f} GiB; Cached {cached0 / 2**20:.0f} -> {cached1 / 2**20:.0f} MiB; "
          f"RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB")
    assert cached1 - cached0 < max(0.03 * cached0, 64 * 2**20)
    assert rss1 - rss0 < max(0.03 * rss0, 16 * 2**20)
