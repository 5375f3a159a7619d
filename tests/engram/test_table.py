"""Storage engine: uncached, deduplicated, concurrent row reads (SPEC §8)."""

from __future__ import annotations

import ctypes
import errno as errno_
import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import ArgumentError, DecodeError, RowCache, RowRangeError, TableIOError
from engram._native import reader as _rd
from engram._native.reader import ReadFailure, RowReader
from engram.codec import decode_rows
from engram.table import ROW_BYTES, Table, _failure_to_error
from engram.uncached import uncached_plan
from tests.faults import backend_params, usable
from tests.tablefiles import rows_raw, write_table

#: Backends that start and read here (the others are skipped with the reason where parametrized).
BACKENDS = usable()
N = 20_000


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    raw = rows_raw(N, seed=1)
    path = tmp_path_factory.mktemp("table") / "t.bin"
    offset = 3 * 4096 + 200  # not block aligned: rows straddle block boundaries
    write_table(path, raw, offset)
    return path, offset, raw, decode_rows(raw)


@pytest.fixture(scope="module", params=backend_params())
def table(request, table_file):
    path, offset, _, _ = table_file
    t = Table(path, offset, N, backend=request.param, readers=8, threshold=4)
    yield t
    t.close()


def patterns(rng):
    yield "random", rng.integers(0, N, (64, 24))
    dup = rng.integers(0, N, (64, 24))
    dup[1::2] = dup[::2]
    dup[:, 5] = dup[:, 4]
    yield "duplicated", dup
    yield "sorted", np.sort(rng.integers(0, N, 64 * 24)).reshape(64, 24)
    yield "one row", np.full((50, 24), 777)
    yield "edges", np.array([[0, N - 1] * 12] * 3)
    # adjacent rows: every row of a few consecutive blocks, reversed
    yield "adjacent", np.arange(1000, 1000 + 48 * 24)[::-1].reshape(48, 24)
    yield "block straddlers", np.array([[r for r in range(N) if (200 + r * ROW_BYTES) % 4096 > 4096 - ROW_BYTES][:24]])


def test_patterns_equal_decode(table, table_file):
    _, _, _, ref = table_file
    rng = np.random.default_rng(5)
    for name, ids in patterns(rng):
        got = table.read_batch(ids.astype(np.uint32))
        assert np.array_equal(got, ref[ids]), name
        st_ = table.last_stats
        assert st_.rows_requested == ids.size and st_.rows_distinct == len(np.unique(ids)), name
        assert st_.reads <= st_.rows_distinct and st_.bytes_read % table.alignment == 0


def test_read_rows_and_dtypes(table, table_file):
    _, _, _, ref = table_file
    ids = np.random.default_rng(6).integers(0, N, 300)
    for dt in (np.uint32, np.int64, np.int32, np.uint16):
        a = ids.astype(dt) if dt is not np.uint16 else (ids % 65536).astype(dt)
        assert np.array_equal(table.read_rows(a), ref[a.astype(np.int64)])
    assert np.array_equal(table.read_rows(ids.tolist()), ref[ids])
    assert table.read_rows(np.empty(0, np.uint32)).shape == (0, 256)


def test_strided_view_of_hasher_output(table, table_file):
    _, _, _, ref = table_file
    full = np.random.default_rng(7).integers(0, N, (40, 2, 24)).astype(np.uint32)
    for layer in (0, 1):
        view = full[:, layer, :]
        assert not view.flags.c_contiguous
        assert np.array_equal(table.read_batch(view), ref[view])
    rev = full[::-1, 0, ::-1]
    assert np.array_equal(table.read_batch(rev), ref[rev])


def test_concurrency_threshold(table_file):
    path, offset, _, ref = table_file
    with Table(path, offset, N, backend="pread", readers=4, threshold=8) as t:
        t.read_rows(np.arange(7) * 100)
        assert t.last_stats.backend == "serial" and t.last_stats.concurrency == 1
        t.read_rows(np.arange(8) * 100)
        assert t.last_stats.backend == "pread" and t.last_stats.concurrency == 4
        t.read_rows(np.full(50, 3))  # 50 requests, one distinct row: serial
        assert t.last_stats.backend == "serial" and t.last_stats.rows_distinct == 1
        assert t.stats.calls == 3 and t.stats.rows_requested == 65


def test_large_batch_chunks_and_out(table, table_file):
    _, _, _, ref = table_file
    ids = np.random.default_rng(8).integers(0, N, (2048 * 2 + 17, 24))
    out = np.full((ids.shape[0], 24, 256), 7.0, np.float32)
    assert table.read_batch(ids, out=out) is out
    assert np.array_equal(out, ref[ids])


def test_offsets_above_4gib(tmp_path):
    raw = rows_raw(3000, seed=2)
    offset = 2**32 + 2**31 + 1234  # sparse file, table beyond 2^32
    path = tmp_path / "big.bin"
    write_table(path, raw, offset)
    ref = decode_rows(raw)
    ids = np.random.default_rng(9).integers(0, 3000, (30, 24))
    for backend in BACKENDS:
        with Table(path, offset, 3000, backend=backend, readers=4, threshold=2) as t:
            assert np.array_equal(t.read_batch(ids), ref[ids]), backend


@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(0, N - 1), min_size=1, max_size=200), backend=st.sampled_from(BACKENDS))
def test_property_any_ids(table_file, ids, backend):
    path, offset, _, ref = table_file
    with Table(path, offset, N, backend=backend, readers=3, threshold=2) as t:
        assert np.array_equal(t.read_rows(ids), ref[ids])


# ------------------------------------------------------------------ errors
def test_range_error_before_io(table):
    out = np.full((2, 24, 256), 3.0, np.float32)
    ids = np.zeros((2, 24), np.uint32)
    ids[1, 7] = N
    before = table.stats.reads
    with pytest.raises(RowRangeError, match=rf"row id {N} at token 1, column 7"):
        table.read_batch(ids, out=out)
    with pytest.raises(RowRangeError, match="row id -1 at token 0, column 2"):
        table.read_batch(np.array([[0, 1, -1]]))
    assert table.stats.reads == before
    assert np.all(out == 3.0)


@given(ids=st.lists(st.one_of(st.integers(-3, 2**32 + 3), st.integers(-2**70, 2**70), st.booleans(),
                              st.floats(0, 10), st.integers(0, 9).map(np.uint32)), max_size=20),
       column=st.booleans())
def test_list_ids_matches_numpy_or_declines(ids, column):
    """The native conversion of a short list of ints equals NumPy's, as [n, 1] or [n], and declines (None)
    anything but exact ints in [0, 2**32): bools, floats, NumPy scalars, negatives, beyond uint32."""
    a = _rd.list_ids(ids, column)
    plain = all(type(x) is int and 0 <= x <= 0xFFFFFFFF for x in ids)
    if not plain:
        assert a is None
        return
    want = np.array(ids, np.uint32).reshape((len(ids), 1) if column else (len(ids),))
    assert a.dtype == np.uint32 and a.shape == want.shape and a.flags.c_contiguous and np.array_equal(a, want)


def test_short_lists_keep_their_errors_and_bounds(table):
    """A one-row list at the table's bounds reads its row; past them, negative, a bool or a float raises the
    error the general path gives, before any I/O."""
    ref = table.read_rows(np.array([0, N - 1]))
    assert np.array_equal(table.read_rows([0]), ref[:1]) and np.array_equal(table.read_rows([N - 1]), ref[1:])
    assert np.array_equal(table.read_rows([np.uint32(N - 1)]), ref[1:])
    before = table.stats.reads
    with pytest.raises(RowRangeError, match=rf"row id {N} at position 0"):
        table.read_rows([N])
    with pytest.raises(RowRangeError, match="row id -1 at position 1"):
        table.read_rows([0, -1])
    with pytest.raises(RowRangeError, match=f"row id {2**32} at position 0"):
        table.read_rows([2**32])
    with pytest.raises(ArgumentError, match="integers"):
        table.read_rows([1.0])
    assert table.stats.reads == before
    keys, skip = _rd.cache_buffers(5)
    assert (keys.dtype, keys.shape, skip.dtype, skip.shape) == (np.uint64, (5,), np.uint8, (5,))


@pytest.mark.parametrize("engine", ["shared", "private"])
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_range_error_on_every_engine_and_backend(table_file, engine, backend):
    """An id past the table is a RowRangeError naming it on every path, the shared engine's ``auto`` included
    (there the reader's backend is the engine's choice, and the error's backend name was looked up in a table
    without it: KeyError), with and without a row cache; ``out`` untouched."""
    path, offset, _, _ = table_file
    with Table(path, offset, N, backend=backend, readers=4, threshold=2, engine=engine) as t:
        for cache in (None, RowCache("1M")):
            if cache is not None:
                t.attach_cache(cache, 0)
            out = np.full((3, 256), 7.0, np.float32)
            for ids in ([N], [0, 5, N], np.array([N - 1, 2**32 - 1], np.uint32)):
                bad = next(int(x) for x in ids if int(x) >= N)
                with pytest.raises(RowRangeError, match=rf"row id {bad} at position \d+ is outside the table"):
                    t.read_rows(ids)
                where = "token 0, column" if len(ids) > 1 else "position"  # one column: the position
                with pytest.raises(RowRangeError, match=rf"row id {bad} at {where} \d+"):
                    t.read_batch(np.array([ids]).astype(np.uint32))
            with pytest.raises(RowRangeError):
                t.read_rows([1, 2, N], out=out)
            assert np.all(out == 7.0)


def test_decode_error_publishes_nothing(tmp_path):
    raw = rows_raw(500, seed=3)
    raw[321, 40] = 0x7F  # an E4M3 NaN code
    raw[400, 256 + 2] = 255  # an E8M0 NaN scale
    path = tmp_path / "nan.bin"
    write_table(path, raw, 4096)
    for backend in BACKENDS:
        with Table(path, 4096, 500, backend=backend, readers=4, threshold=2) as t:
            out = np.full((3, 256), 5.0, np.float32)
            with pytest.raises(DecodeError, match="row 321 .* column 40") as ei:
                t.read_rows([5, 321, 6], out=out)
            assert ei.value.row == 321 and ei.value.column == 40
            with pytest.raises(DecodeError, match="row 400 .* column 64"):
                t.read_rows([400])
            assert np.all(out == 5.0)
            assert np.array_equal(t.read_rows([5, 6]), decode_rows(raw[[5, 6]]))


def test_truncated_after_open_is_short_read(tmp_path):
    raw = rows_raw(4000, seed=4)
    path = tmp_path / "trunc.bin"
    write_table(path, raw, 0, tail=0)
    for backend in BACKENDS:
        write_table(path, raw, 0, tail=0)
        with Table(path, 0, 4000, backend=backend, readers=4, threshold=2) as t:
            os.truncate(path, 2000 * ROW_BYTES + 10)
            out = np.full((4, 256), 1.0, np.float32)
            with pytest.raises(TableIOError, match=r"row 3999 at file offset 1055736") as ei:
                t.read_rows([1, 2, 3999, 3], out=out)
            assert ei.value.row == 3999 and ei.value.offset == 3999 * ROW_BYTES
            assert np.all(out == 1.0)
            assert np.array_equal(t.read_rows([1, 1999]), decode_rows(raw[[1, 1999]]))


def test_open_errors(tmp_path, table_file):
    path, offset, _, _ = table_file
    with pytest.raises(TableIOError, match="no such file"):
        Table(tmp_path / "missing.bin", 0, 10)
    with pytest.raises(TableIOError, match="past the end of the file"):
        Table(path, offset, N + 1)
    for kw, msg in ((dict(readers=0), "readers"), (dict(threshold=-1), "threshold"),
                    (dict(backend="aio"), "backend"), (dict(direct="yes"), "direct"),
                    (dict(block_size=1000), "block_size")):
        with pytest.raises(ArgumentError, match=msg):
            Table(path, offset, N, **kw)


def test_argument_errors(table):
    with pytest.raises(ArgumentError, match="2-D"):
        table.read_batch(np.zeros(5, np.uint32))
    with pytest.raises(ArgumentError, match="integers"):
        table.read_rows(np.zeros(5, np.float32))
    good = np.zeros((2, 24, 256), np.float32)
    bads = [np.zeros((2, 24, 256), np.float64), np.zeros((2, 24, 255), np.float32),
            np.zeros((2, 256, 24), np.float32).transpose(0, 2, 1), "x"]
    ro = good.copy()
    ro.setflags(write=False)
    bads.append(ro)
    for out in bads:
        with pytest.raises(ArgumentError, match="out must be"):
            table.read_batch(np.zeros((2, 24), np.uint32), out=out)


def test_closed_table(table_file):
    path, offset, _, _ = table_file
    t = Table(path, offset, N)
    t.close()
    t.close()
    with pytest.raises(TableIOError, match="closed"):
        t.read_rows([1])


def test_direct_and_buffered_modes(table_file):
    path, offset, _, ref = table_file
    with Table(path, offset, N, direct=False) as t:
        assert not t.direct and t.alignment == 1
        assert np.array_equal(t.read_rows([3, 9, 3]), ref[[3, 9, 3]])
    with Table(path, offset, N, direct=True, block_size=4096) as t:
        assert t.direct and t.alignment == 4096
        assert np.array_equal(t.read_rows([3, 9, 3]), ref[[3, 9, 3]])


def test_tmpfs_reads(tmp_path):
    """tmpfs: O_DIRECT where the kernel allows it (Linux >= 6.6), else the fadvise fallback."""
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        pytest.skip("no /dev/shm")
    raw = rows_raw(100, seed=5)
    path = os.path.join(shm, f"engram-test-{os.getpid()}.bin")
    try:
        write_table(path, raw, 0)
        with Table(path, 0, 100) as t:
            assert np.array_equal(t.read_rows([1, 50, 99]), decode_rows(raw[[1, 50, 99]]))
    finally:
        os.unlink(path)


def test_refused_o_direct_falls_back(table_file, monkeypatch):
    """A file system that refuses O_DIRECT at open (EINVAL) gets the fadvise descriptor."""
    import errno

    path, offset, _, ref = table_file
    real_open = os.open

    def refusing_open(p, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(os, "open", refusing_open)
    with Table(path, offset, N) as t:
        assert not t.direct and t.alignment == 1
        assert "refuses O_DIRECT at open" in t.direct_fallback
        assert np.array_equal(t.read_rows([3, 9, 3]), ref[[3, 9, 3]])
    with pytest.warns(RuntimeWarning, match=r"block_size=4096 given, but O_DIRECT is off: the file system refuses"):
        with Table(path, offset, N, block_size=4096) as t:  # an explicit block_size turned off: said so
            assert not t.direct and "refuses O_DIRECT" in t.direct_fallback
    with pytest.raises(TableIOError, match="O_DIRECT"):
        Table(path, offset, N, direct=True)
    with Table(path, offset, N, direct=False) as t:  # never tried: nothing to explain
        assert t.direct_fallback is None


@pytest.mark.parametrize("platform,direct,has_o_direct,has_fadvise,want", [
    ("linux", "auto", True, True, (True, "fadvise")),
    ("linux", True, True, True, (True, "fadvise")),
    ("linux", False, True, True, (False, "fadvise")),
    ("freebsd14", "auto", True, True, (True, "fadvise")),
    ("darwin", "auto", False, False, (False, "f_nocache")),
    ("darwin", False, False, False, (False, "f_nocache")),
    ("sunos5", "auto", False, False, (False, "plain")),
])
def test_uncached_plan_per_platform(platform, direct, has_o_direct, has_fadvise, want):
    p = uncached_plan(platform, direct, has_o_direct, has_fadvise)
    assert (p.try_direct, p.buffered) == want


def test_uncached_plan_errors():
    with pytest.raises(TableIOError, match="O_DIRECT is not available on darwin"):
        uncached_plan("darwin", True, False, False)
    with pytest.raises(ArgumentError, match="direct must be True, False or 'auto'"):
        uncached_plan("linux", "yes", True, True)


# ------------------------------------------------------------------ cache
def _resident_pages(path) -> int:
    """Pages of ``path`` in the page cache: mincore(2) on a mapping made only for this check."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    npages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    try:
        vec = (ctypes.c_ubyte * npages)()
        view = np.frombuffer(m, dtype=np.uint8)
        rc = libc.mincore(view.ctypes.data, ctypes.c_size_t(size), vec)
        err = ctypes.get_errno()
        del view
        assert rc == 0, os.strerror(err)
        return sum(v & 1 for v in vec)
    finally:
        m.close()


@pytest.mark.parametrize("direct", [True, False])
def test_reads_leave_no_pages_cached(tmp_path, direct):
    raw = rows_raw(N, seed=6)
    path = tmp_path / "cache.bin"
    write_table(path, raw, 0)
    assert _resident_pages(path) == 0
    pages = -(-os.path.getsize(path) // mmap.PAGESIZE)
    ids = np.random.default_rng(10).integers(0, N, (400, 24))
    for backend in BACKENDS:
        with Table(path, 0, N, backend=backend, direct=direct, readers=4) as t:
            t.read_batch(ids)
        resident = _resident_pages(path)
        if direct:
            assert resident == 0, backend
        else:
            # Buffered fallback: DONTNEED skips a page another reader holds locked at that
            # instant, so a stray page may stay; best effort, bounded.
            assert resident <= max(2, pages // 200), (backend, resident, pages)


# ------------------------------------------------------------------ failures of the reader
def test_read_failure_has_named_fields_and_rejects_wrong_calls():
    f = ReadFailure("io", row=7, offset=4096 + 7 * ROW_BYTES, segment=1, errno=5, backend="io_uring")
    assert (f.kind, f.row, f.offset, f.segment, f.errno, f.backend) == ("io", 7, 4096 + 7 * ROW_BYTES, 1, 5,
                                                                        "io_uring")
    assert (f.token, f.column, f.value_column) == (-1, -1, -1)
    with pytest.raises(TypeError):
        ReadFailure("ring", 0, 0, 0, 22, 0)  # the old positional call fails where it is made
    with pytest.raises(TypeError):
        ReadFailure("io", rows=3)
    with pytest.raises(ValueError, match="unknown ReadFailure kind"):
        ReadFailure("eof")
    with pytest.raises(ValueError, match="unknown read backend"):
        ReadFailure("io", backend="aio")


PATHS, ROWS = ["/m/a.gguf", "/m/b.gguf"], [100, 200]


@pytest.mark.parametrize("names", [None, ["table 0", "table 1"]])
def test_failure_to_error_every_kind(names):
    import errno

    label = " (table 1)" if names else ""
    e = _failure_to_error(ReadFailure("range", row=250, token=3, column=30, segment=1), PATHS, ROWS, True, names)
    assert isinstance(e, RowRangeError)
    assert str(e) == f"/m/b.gguf{label}: row id 250 at token 3, column 30 is outside the table [0, 200)"
    e = _failure_to_error(ReadFailure("range", row=100, token=9, column=0), PATHS, ROWS, False, names)
    assert "position 9" in str(e) and "[0, 100)" in str(e)
    e = _failure_to_error(ReadFailure("decode", row=12, offset=9999, segment=1, value_column=40), PATHS, ROWS, True,
                          names)
    assert isinstance(e, DecodeError) and (e.row, e.column) == (12, 40)
    assert str(e).startswith(f"/m/b.gguf{label}: row 12 (file offset 9999) column 40 does not decode")
    e = _failure_to_error(ReadFailure("short", row=5, offset=1234, segment=0, backend="pread"), PATHS, ROWS, True,
                          names)
    assert isinstance(e, TableIOError) and (e.row, e.offset, e.errno_) == (5, 1234, errno.EIO)
    assert "short read: row 5 at file offset 1234" in str(e)
    e = _failure_to_error(ReadFailure("io", row=6, offset=4321, segment=1, errno=errno.EIO, backend="pread"), PATHS,
                          ROWS, True, names)
    assert isinstance(e, TableIOError) and (e.row, e.offset, e.errno_) == (6, 4321, errno.EIO)
    assert str(e) == (f"/m/b.gguf{label}: reading row 6 at file offset 4321 through pread failed: "
                      f"Input/output error")
    e = _failure_to_error(ReadFailure("io", row=6, offset=4321, errno=errno.EINVAL, backend="io_uring"), PATHS,
                          ROWS, True, names)
    assert "through io_uring failed: Invalid argument" in str(e) and e.errno_ == errno.EINVAL
    e = _failure_to_error(ReadFailure("ring", errno=errno.EBADF, backend="io_uring"), PATHS, ROWS, True, names)
    assert isinstance(e, TableIOError) and e.errno_ == errno.EBADF
    assert "/m/a.gguf, /m/b.gguf: io_uring failed: io_uring_enter: Bad file descriptor (EBADF)" == str(e)


def test_reader_raises_each_kind_with_its_fields(tmp_path):
    """range, decode and short from a real reader (io: tests/engram/test_faults.py, ring: below)."""
    raw = rows_raw(300, seed=11)
    raw[17, 3] = 0x7F  # E4M3 NaN code
    path = tmp_path / "k.bin"
    write_table(path, raw, 512)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = RowReader([(fd, 512, 300), (fd, 512, 250)], 1)
        out = np.empty((2, 4, 256), np.float32)
        with pytest.raises(ReadFailure) as ei:
            r.read(np.array([[1, 2, 3, 4], [5, 6, 7, 260]], np.uint32), out, 0, _rd.BACKEND_SERIAL, 2)
        f = ei.value
        assert (f.kind, f.row, f.token, f.column, f.segment) == ("range", 260, 1, 3, 1)
        with pytest.raises(ReadFailure) as ei:
            r.read(np.array([[1, 17]], np.uint32), out[:1, :2], 0, _rd.BACKEND_SERIAL, 2)
        f = ei.value
        assert (f.kind, f.row, f.offset, f.segment, f.value_column) == ("decode", 17, 512 + 17 * ROW_BYTES, 0, 3)
        os.truncate(path, 512 + 100 * ROW_BYTES)
        with pytest.raises(ReadFailure) as ei:
            r.read(np.array([[1, 200]], np.uint32), out[:1, :2], 0, _rd.BACKEND_SERIAL, 2)
        f = ei.value
        assert (f.kind, f.row, f.offset, f.segment, f.backend) == ("short", 200, 512 + 200 * ROW_BYTES, 0, "serial")
        r.close()
    finally:
        os.close(fd)


def _ring_fds() -> set:
    """Descriptors of this process that are io_uring instances."""
    out = set()
    for e in os.listdir("/proc/self/fd"):
        try:
            if "io_uring" in os.readlink(f"/proc/self/fd/{e}"):
                out.add(int(e))
        except OSError:  # the directory's own descriptor, gone by now
            pass
    return out


@pytest.mark.skipif("io_uring" not in BACKENDS, reason="io_uring does not start here (see engram info)")
def test_ring_whose_enter_fails_raises_ring_kind_and_restarts(table_file):
    """io_uring_enter itself fails (the ring's descriptor replaced behind its back): ReadFailure "ring"
    with the errno; the ring is torn down and the next read on the ring path starts a new one."""
    path, offset, _, ref = table_file
    fd = os.open(path, os.O_RDONLY)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        r = RowReader([(fd, offset, N)], 1)
        before = _ring_fds()
        assert r.start_ring(4) == 0
        ring_fd = sorted(_ring_fds() - before)
        assert len(ring_fd) == 1
        os.dup2(null, ring_fd[0])  # io_uring_enter on /dev/null: EOPNOTSUPP
        ids = np.array([[3, 9, 12, 400]], np.uint32)
        out = np.empty((1, 4, 256), np.float32)
        with pytest.raises(ReadFailure) as ei:
            r.read(ids, out, 0, _rd.BACKEND_URING, 4)
        f = ei.value
        assert f.kind == "ring" and f.backend == "io_uring" and f.errno in (errno_.EOPNOTSUPP, errno_.EBADF)
        r.read(ids, out, 0, _rd.BACKEND_URING, 4)  # a new ring
        assert np.array_equal(out, ref[ids])
        r.close()
    finally:
        os.close(null)
        os.close(fd)

