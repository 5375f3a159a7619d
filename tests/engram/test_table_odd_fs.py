"""Tables on file systems that refuse O_DIRECT or need other alignment (issue 18), on real mounts.

- An uncompressed squashfs image, loop-mounted, and overlayfs on it (how container images
  ship models): O_DIRECT is refused, and squashfs fills the page cache a whole block (128 KiB)
  at a time, so dropping the pages of the exact span a row occupies leaves most of the
  table set cached.  The buffered fallback must keep the table files' cache flat.
- A 4Kn device (a loop device with 4096-byte sectors, ext4 on it): an explicit
  ``block_size=512`` with ``direct="auto"`` turns O_DIRECT off, and must say so.

Mounting needs root, loop devices, ``mksquashfs`` (Debian: squashfs-tools) and ``mkfs.ext4``;
each test skips with the reason where one is missing.  Residency is counted with mincore(2)
on a mapping made only for the check (the engine never maps a table).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engram import EngramModel, Hasher, Table, decode_rows, load_tokenizer, synth
from engram._native.reader import RowReader
from engram.table import ROW_BYTES
from tests.modelfiles import SCALE, token_map
from tests.tablefiles import rows_raw, write_table

STEPS = 400


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not installed")
    return path


def _run(cmd, what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{what} unavailable here: {' '.join(map(str, cmd))}: {r.stderr.strip() or r.returncode}")
    return r.stdout.strip()


@contextlib.contextmanager
def mounted(cmd, mountpoint: Path, what: str):
    """``cmd`` mounts something at ``mountpoint``; unmounted on exit, even after a failure."""
    if os.geteuid() != 0:
        pytest.skip(f"{what}: mounting needs root")
    mountpoint.mkdir(parents=True, exist_ok=True)
    _run(cmd, what)
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def resident_pages(path) -> int:
    """Pages of ``path`` in the page cache (mincore on a mapping made for this check)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    try:
        vec = (ctypes.c_ubyte * n)()
        view = np.frombuffer(m, np.uint8)
        assert libc.mincore(view.ctypes.data, ctypes.c_size_t(size), vec) == 0, os.strerror(ctypes.get_errno())
        del view
        return int(np.frombuffer(vec, np.uint8).__and__(1).sum())
    finally:
        m.close()


def drop_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- squashfs (+ overlayfs)
@pytest.fixture(scope="module")
def squashfs(tmp_path_factory):
    """A ~100 MB two-table model in an uncompressed squashfs image, loop-mounted read-only,
    and an overlayfs with that mount as its lower layer."""
    _need("mksquashfs")
    if os.geteuid() != 0:
        pytest.skip("squashfs: mounting needs root")
    root = tmp_path_factory.mktemp("sqfs")
    src = root / "src"
    src.mkdir()
    synth.build_model(src / "m.gguf", synth.ModelShape(scale=SCALE, token_map=token_map()),
                      synth.Fill(projections=False), progress=False)
    img = root / "model.sqfs"
    _run(["mksquashfs", str(src), str(img), "-noI", "-noD", "-noF", "-noX", "-quiet", "-no-progress"], "mksquashfs")
    with mounted(["mount", "-t", "squashfs", "-o", "loop,ro", str(img), str(root / "lower")], root / "lower",
                 "a loop-mounted squashfs") as lower:
        for d in ("upper", "work"):
            (root / d).mkdir()
        opts = f"lowerdir={lower},upperdir={root / 'upper'},workdir={root / 'work'}"
        with mounted(["mount", "-t", "overlay", "overlay", "-o", opts, str(root / "merged")], root / "merged",
                     "overlayfs") as merged:
            yield {"squashfs": lower / "m.gguf", "overlayfs": merged / "m.gguf", "image": img}


def _decode_tokens() -> np.ndarray:
    """Token ids of STEPS decode steps of a text that ships with Python."""
    text = Path(os.__file__).read_text(encoding="utf-8")
    return np.array(load_tokenizer().encode(text, add_special_tokens=False).ids[:STEPS])


@pytest.mark.parametrize("fs", ["squashfs", "overlayfs"])
def test_buffered_fallback_keeps_page_cache_flat(squashfs, fs):
    """400 decode steps of a ~100 MB table set on squashfs (and overlayfs on it): O_DIRECT is
    refused, the rows are exact, and the model file keeps (almost) no page cached; a control reader
    that drops only the pages of each row's own span leaves a large part of the file cached."""
    path = squashfs[fs]
    model = EngramModel.open(path)
    tokens = _decode_tokens()
    rows = Hasher(model.layout, model.token_map).hash(tokens)  # [T, 2, 24]
    pages = -(-os.path.getsize(path) // mmap.PAGESIZE)
    drop_cache(path)
    assert resident_pages(path) == 0
    with model.session() as s:
        for t in s.tables.values():
            assert not t.direct and "O_DIRECT" in t.direct_fallback
            assert t.drop_bytes == 128 * 1024, (fs, t.drop_bytes)  # the squashfs block, measured
        for i, tok in enumerate(tokens):
            got = s.step(int(tok))
            if i % 50 == 0:
                for li, lid in enumerate(model.layer_ids):
                    assert np.array_equal(got[lid], decode_rows(synth.rows_at(lid, rows[i, li]))), (fs, i)
    after = resident_pages(path)
    print(f"{fs}: {after} of {pages} pages resident after {STEPS} decode steps")
    assert after <= 64, (fs, after, pages)  # a few fill units at most (a page locked while dropped)

    # control: the same reads dropping only each span's own pages, as before the fill unit
    loc = [model.info.tables[lid] for lid in model.layer_ids]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        r = RowReader([(fd, t.offset, t.rows) for t in loc], 1, mmap.PAGESIZE, 0)
        out = np.empty((1, 48, 256), np.float32)
        for step in rows:
            r.read(step.reshape(1, -1).astype(np.uint32), out, 0, 0, 24)
        r.close()
    finally:
        os.close(fd)
    control = resident_pages(path)
    table_pages = sum(t.rows * ROW_BYTES for t in loc) // mmap.PAGESIZE
    print(f"{fs}: control (exact spans dropped) leaves {control} pages; the tables span {table_pages}")
    assert control > table_pages // 4 and control > 20 * max(after, 1), (control, after, table_pages)
    drop_cache(path)


def test_explicit_block_size_on_squashfs_says_o_direct_is_off(squashfs):
    path = squashfs["squashfs"]
    info = EngramModel.open(path).info
    loc = info.tables[info.layout.layer_ids[0]]
    with pytest.warns(RuntimeWarning, match=r"block_size=4096 given, but O_DIRECT is off: the file system "
                                            r"refuses O_DIRECT at open \(Invalid argument\)"):
        t = Table(path, loc.offset, loc.rows, block_size=4096)
    with t:
        assert not t.direct and t.alignment == 1 and "refuses O_DIRECT" in t.direct_fallback


# ---------------------------------------------------------------------- a 4Kn device
@pytest.fixture(scope="module")
def ext4_4kn(tmp_path_factory):
    """ext4 on a loop device with 4096-byte logical sectors, holding a small table."""
    _need("mkfs.ext4")
    _need("losetup")
    if os.geteuid() != 0:
        pytest.skip("4Kn loop device: needs root")
    root = tmp_path_factory.mktemp("4kn")
    img = root / "disk.img"
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    dev = _run(["losetup", "--sector-size", "4096", "--find", "--show", str(img)], "a 4Kn loop device")
    try:
        _run(["mkfs.ext4", "-q", "-F", dev], "mkfs.ext4")
        with mounted(["mount", dev, str(root / "mnt")], root / "mnt", "ext4 on a 4Kn loop device") as mnt:
            raw = rows_raw(5000, seed=8)
            write_table(mnt / "t.bin", raw, 4096 + 300)
            yield mnt / "t.bin", raw
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_block_size_smaller_than_the_device_block_says_o_direct_is_off(ext4_4kn):
    path, raw = ext4_4kn
    ids = np.random.default_rng(3).integers(0, 5000, (30, 24))
    ref = decode_rows(raw)
    with Table(path, 4096 + 300, 5000) as t:  # the device's logical block: direct, aligned to 4096
        assert t.direct and t.alignment == 4096 and t.direct_fallback is None
        assert np.array_equal(t.read_batch(ids), ref[ids])
    with pytest.warns(RuntimeWarning, match=r"block_size=512 given, but O_DIRECT is off: an O_DIRECT read of "
                                            r"\d+ bytes at offset \d+ was refused \(Invalid argument\)"):
        t = Table(path, 4096 + 300, 5000, block_size=512)
    with t:
        assert not t.direct and "was refused (Invalid argument)" in t.direct_fallback
        assert np.array_equal(t.read_batch(ids), ref[ids])
    drop_cache(path)
    assert resident_pages(path) == 0
