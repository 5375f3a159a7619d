"""Fault injection (issue 9): files that change under an open table, EIO, short reads, EINTR,
signal storms, readers that cannot start, prefetches cancelled mid-flight.

Every fault must surface as a typed error naming the row and file offset (output untouched,
history kept) or as a documented fallback, never as a hang, a crash or wrong rows; no
descriptor or thread may leak.  Faults come from three real sources:

- the file itself: truncated, deleted or re-extended while a table is open;
- a FUSE file system of our own (``tests/faults/fusefs.py``) that answers reads with EIO,
  EINTR, short reads or delays, through the kernel, so every backend (io_uring included)
  sees them;
- an ``LD_PRELOAD`` shim (``tests/faults/shim.c``, compiled here) that does the same to
  ``pread`` in a child process (serial and pread backends), plus resource limits that stop
  an io_uring ring or reader threads from starting.

Device-mapper's ``error`` target would give EIO from a block device too, but the kernels
these tests run on (developer machines and CI containers) ship without device-mapper, so
the FUSE file system stands in for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import threading
import time

import numpy as np
import pytest

from engram import EngramModel, Hasher, Table, TableGroup, TableIOError, decode_rows, synth
from engram._native.reader import MAX_SPAN_BYTES
from engram.prefetch import PrefetchCancelled
from engram.backends import probe_backends
from engram.table import ROW_BYTES
from tests.faults import (FaultMount, backend_params, build_shim, fd_count, fuse_unavailable, run_child,
                          thread_count, usable)
from tests.modelfiles import token_map as _token_map
from tests.tablefiles import rows_raw, write_table

#: Backends that start and read here (parametrized tests skip the others with the reason).
BACKENDS = usable()
N = 6000
OFFSET = 4096 + 100  # rows straddle block boundaries
MODEL_SCALE = 0.0001  # ~40k rows a table, tables ~11 MB, projections left as holes

#: Faults injected per test, summed for the README's reliability section (printed with -s).
FAULTS: dict = {}


def _count(kind: str, n: int) -> None:
    FAULTS[kind] = FAULTS.get(kind, 0) + int(n)


@pytest.fixture(scope="module", autouse=True)
def _report_faults():
    yield
    print(f"\nfaults injected: {FAULTS} (total {sum(FAULTS.values())})")


# ====================================================================== fixtures
@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    raw = rows_raw(N, seed=21)
    write_table(root / "t.bin", raw, OFFSET)
    return root, raw, decode_rows(raw)


def _build_model(path, seed=5):
    synth.build_model(path, synth.ModelShape(scale=MODEL_SCALE, token_map=_token_map(), seed=seed),
                      synth.Fill(projections=False), progress=False)
    return path


def _expected(model, row_ids, seed=5):
    """Rows a fault-free read gives: {layer: float32 [T, 24, 256]} from the synthetic content."""
    out = {}
    for li, lid in enumerate(model.layer_ids):
        ids = np.asarray(row_ids)[..., li, :]
        out[lid] = decode_rows(synth.rows_at(lid, ids.reshape(-1), seed=seed)).reshape(ids.shape + (256,))
    return out


@pytest.fixture(scope="module")
def text_ids(tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[20000:40000]
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids[:3000])


@contextlib.contextmanager
def no_leaks(slack_threads=0):
    """The block leaves as many descriptors and threads open as it found."""
    fds, threads = fd_count(), thread_count()
    yield
    deadline = time.monotonic() + 5
    while (fd_count() > fds or thread_count() > threads + slack_threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fd_count() <= fds, f"descriptors leaked: {fds} -> {fd_count()}"
    assert thread_count() <= threads + slack_threads, f"threads leaked: {threads} -> {thread_count()}"


# ====================================================================== the file changes
@pytest.mark.parametrize("backend", backend_params())
def test_truncated_while_open_then_restored(tmp_path, table_dir, backend):
    _, raw, ref = table_dir
    path = tmp_path / "t.bin"
    write_table(path, raw, OFFSET)
    size = os.path.getsize(path)
    ids = np.random.default_rng(1).integers(0, N, (40, 24))
    ids[7, 3] = N - 1
    with no_leaks(), Table(path, OFFSET, N, backend=backend, readers=8, threshold=2) as t:
        assert np.array_equal(t.read_batch(ids), ref[ids])
        cut_row = N // 2
        os.truncate(path, OFFSET + cut_row * ROW_BYTES + 10)
        _count("truncate", 1)
        out = np.full((40, 24, 256), 9.0, np.float32)
        with pytest.raises(TableIOError, match="short read") as ei:
            t.read_batch(ids, out=out)
        e = ei.value
        assert e.row >= cut_row and e.offset == OFFSET + e.row * ROW_BYTES and e.errno_ == errno.EIO
        assert f"row {e.row} at file offset {e.offset}" in str(e) and str(path) in str(e)
        assert np.all(out == 9.0)  # nothing published
        low = ids % cut_row
        assert np.array_equal(t.read_batch(low), ref[low])  # rows still present read fine
        write_table(path, raw, OFFSET)  # the file comes back: so do the rows
        assert os.path.getsize(path) == size
        assert np.array_equal(t.read_batch(ids, out=out), ref[ids])


def test_session_on_truncated_model_keeps_history(tmp_path, text_ids):
    path = _build_model(tmp_path / "m.gguf")
    model = EngramModel.open(path)
    ids = text_ids[:40]
    ref_ids = Hasher(model.layout, model.token_map).hash(ids)
    ref = _expected(model, ref_ids)
    with no_leaks(), model.session() as s:
        for t in range(20):
            rows = s.step(int(ids[t]))
            assert all(np.array_equal(rows[lid], ref[lid][t]) for lid in model.layer_ids)
        size = os.path.getsize(path)
        os.truncate(path, model.info.tables[14].offset + 100 * ROW_BYTES)  # cuts table 14 only
        _count("truncate", 1)
        before = s.snapshot()
        with pytest.raises(TableIOError, match=r"short read: row \d+ at file offset \d+") as ei:
            s.step(int(ids[20]))
        assert ei.value.row >= 100
        assert s.history == before  # the failed step can be retried
        with open(path, "r+b") as f:  # restore the cut rows from the synthetic content
            f.truncate(size)
            loc = model.info.tables[14]
            f.seek(loc.offset)
            f.write(synth.table_rows(14, 0, loc.rows, seed=5).tobytes())
        for t in range(20, 40):
            rows = s.step(int(ids[t]))
            assert all(np.array_equal(rows[lid], ref[lid][t]) for lid in model.layer_ids), t


def test_deleted_while_open(tmp_path, text_ids):
    """An unlinked model keeps serving the sessions already open (their descriptors hold the
    file); new sessions and weights that were never loaded fail with TableIOError."""
    path = _build_model(tmp_path / "gone.gguf")
    model = EngramModel.open(path)
    ids = text_ids[:30]
    ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
    with no_leaks(), model.session() as s:
        for t in range(10):
            s.step(int(ids[t]))
        os.unlink(path)
        _count("delete", 1)
        for t in range(10, 30):
            rows = s.step(int(ids[t]))
            assert all(np.array_equal(rows[lid], ref[lid][t]) for lid in model.layer_ids)
        with pytest.raises(TableIOError, match="no such file"):
            model.session()
        with pytest.raises(TableIOError, match="gone.gguf: cannot open to read blk.1.engram_kv.weight"):
            model.weights(1)


# ====================================================================== LD_PRELOAD shim
SHIM_CHILD = r'''
import json, os, numpy as np
from engram import Table, TableIOError, read_model
from engram.codec import decode_rows
from tests.faults import SHIM_EINTR, SHIM_EIO, SHIM_EOF, SHIM_SHORT, preloaded_shim, fd_count, thread_count
from tests.tablefiles import rows_raw, write_table

shim = preloaded_shim()
path, N, OFF = os.environ["T_PATH"], 3000, 4096 + 100
raw = rows_raw(N, seed=4)
write_table(path, raw, OFF)
ref = decode_rows(raw)
ids = np.random.default_rng(2).integers(0, N, (300, 24))
res, fired = {}, {}
fds0, thr0 = fd_count(), thread_count()
for mode, name in ((SHIM_EIO, "eio"), (SHIM_EINTR, "eintr"), (SHIM_SHORT, "short"), (SHIM_EOF, "eof")):
    for backend in ("serial", "pread"):
        for direct in (True, False):
            key = f"{name}/{backend}/{'direct' if direct else 'buffered'}"
            with Table(path, OFF, N, backend=backend, readers=4, threshold=2, direct=direct) as t:
                shim.engram_fault_set(mode, b"t-shim.bin", OFF, 1 << 60, 3, -1, 512 if direct else 1)
                out = np.full(ids.shape + (256,), 7.0, np.float32)
                try:
                    t.read_batch(ids, out=out)
                    r = {"exact": bool(np.array_equal(out, ref[ids]))}
                except TableIOError as e:
                    r = {"error": str(e), "errno": e.errno_, "row": e.row, "offset": e.offset,
                         "untouched": bool(np.all(out == 7.0))}
                r["fired"] = shim.engram_fault_fired()
                shim.engram_fault_set(0, b"", 0, 0, 1, -1, 1)
                # a transient fault (one EIO) fails one call; the next call reads everything
                if mode == SHIM_EIO:
                    shim.engram_fault_set(SHIM_EIO, b"t-shim.bin", OFF, 1 << 60, 1, 1, 1)
                    try:
                        t.read_rows([1, 2, 3])
                        r["transient"] = "no error"
                    except TableIOError:
                        r["transient"] = "error"
                    shim.engram_fault_set(0, b"", 0, 0, 1, -1, 1)
                    r["retry_exact"] = bool(np.array_equal(t.read_rows([1, 2, 3]), ref[[1, 2, 3]]))
                    r["fired"] += 1
            res[key] = r
res["leaks"] = [fd_count() - fds0, thread_count() - thr0]
# EIO while reading a model header and a weight tensor
from engram import synth
from tests.modelfiles import token_map
mpath = os.environ["M_PATH"]
synth.build_model(mpath, synth.ModelShape(scale=0.0001, token_map=token_map()), synth.Fill(projections=False),
                  progress=False)
info = read_model(mpath)
fds0, thr0 = fd_count(), thread_count()
shim.engram_fault_set(SHIM_EIO, os.path.basename(mpath).encode(), 1000, 1001, 1, -1, 1)
try:
    read_model(mpath)
    res["header"] = {"error": None}
except TableIOError as e:
    res["header"] = {"error": str(e), "errno": e.errno_, "offset": e.offset}
res["header"]["fired"] = shim.engram_fault_fired()
shim.engram_fault_set(0, b"", 0, 0, 1, -1, 1)
loc = info.layers[14].q_norm
shim.engram_fault_set(SHIM_EIO, os.path.basename(mpath).encode(), loc.offset, loc.offset + 1, 1, -1, 1)
try:
    info.read_tensor(loc.name)
    res["tensor"] = {"error": None}
except TableIOError as e:
    res["tensor"] = {"error": str(e), "errno": e.errno_, "offset": e.offset}
res["tensor"]["fired"] = shim.engram_fault_fired()
shim.engram_fault_set(0, b"", 0, 0, 1, -1, 1)
res["leaks"] += [fd_count() - fds0, thread_count() - thr0]
print(json.dumps(res))
'''


def test_pread_faults_through_shim(tmp_path):
    try:
        lib = build_shim(tmp_path)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    res = run_child(SHIM_CHILD, preload=lib, env={"T_PATH": str(tmp_path / "t-shim.bin"),
                                                  "M_PATH": str(tmp_path / "m-shim.gguf")})
    for key, r in res.items():
        if "/" not in key:
            continue
        mode = key.split("/")[0]
        assert r["fired"] > 0, key
        _count(f"shim {mode}", r["fired"])
        if mode in ("eintr", "short"):  # retried or continued: the rows are exact
            assert r.get("exact") is True, (key, r)
        else:
            assert "error" in r and r["untouched"], (key, r)
            assert r["offset"] == 4096 + 100 + r["row"] * ROW_BYTES, (key, r)
            assert f"row {r['row']} at file offset {r['offset']}" in r["error"], (key, r)
            if mode == "eio":
                assert r["errno"] == errno.EIO and "Input/output error" in r["error"], (key, r)
                assert r["transient"] == "error" and r["retry_exact"], (key, r)
            else:
                assert "short read" in r["error"], (key, r)
    for part in ("header", "tensor"):
        r = res[part]
        assert r["error"] and r["errno"] == errno.EIO and r["fired"] == 1, (part, r)
        assert "m-shim.gguf" in r["error"] and f"offset {r['offset']}" in r["error"], (part, r)
        _count("shim eio", 1)
    assert res["header"]["offset"] <= 1000
    assert res["leaks"] == [0, 0, 0, 0]  # descriptors and threads: after the table faults, the model faults


# ====================================================================== FUSE
@pytest.fixture(scope="module")
def fuse(tmp_path_factory, table_dir):
    why = fuse_unavailable()
    if why:
        pytest.skip(f"FUSE fault file system unavailable: {why}")
    root, _, _ = table_dir
    work = tmp_path_factory.mktemp("fuse")
    try:
        with FaultMount(root, work / "mnt", work) as m:
            yield m
    except RuntimeError as exc:  # the mount itself failed (e.g. a container without FUSE rights)
        pytest.skip(str(exc))


def _fired(m: FaultMount, mode: str, before: dict) -> int:
    return m.stats().get(mode, 0) - before.get(mode, 0)


@pytest.mark.parametrize("backend", backend_params())
def test_fuse_eio_names_row_and_offset(fuse, table_dir, backend):
    _, _, ref = table_dir
    lo_row, hi_row = 2500, 2510
    fuse.set_rules([{"name": "t.bin", "lo": OFFSET + lo_row * ROW_BYTES, "hi": OFFSET + hi_row * ROW_BYTES,
                     "mode": "eio"}])
    before = fuse.stats()
    try:
        ids = np.random.default_rng(3).integers(0, N, (64, 24))
        ids[10, 5] = 2505
        with no_leaks(), Table(fuse.path("t.bin"), OFFSET, N, backend=backend, readers=8, threshold=2) as t:
            out = np.full((64, 24, 256), 4.0, np.float32)
            with pytest.raises(TableIOError, match="Input/output error") as ei:
                t.read_batch(ids, out=out)
            e = ei.value
            assert e.errno_ == errno.EIO and e.offset == OFFSET + e.row * ROW_BYTES
            # the named row is the first of the failing read, a span of at most MAX_SPAN_BYTES
            assert abs(e.row - 2505) * ROW_BYTES < MAX_SPAN_BYTES + ROW_BYTES
            assert np.all(out == 4.0)
            far = ids % 2000
            assert np.array_equal(t.read_batch(far, out=out), ref[far])  # the rest of the device works
    finally:
        fuse.set_rules([])
    _count(f"fuse eio ({backend})", _fired(fuse, "eio", before))
    assert _fired(fuse, "eio", before) >= 1


@pytest.mark.parametrize("mode,every", [("short", 2), ("eintr", 3)])
def test_fuse_short_reads_and_eintr_are_exact(fuse, table_dir, mode, every):
    _, _, ref = table_dir
    fuse.set_rules([{"name": "t.bin", "lo": OFFSET, "mode": mode, "every": every}])
    before = fuse.stats()
    try:
        ids = np.random.default_rng(4).integers(0, N, (400, 24))
        for backend in BACKENDS:
            for direct in (True, False):
                with no_leaks(), Table(fuse.path("t.bin"), OFFSET, N, backend=backend, readers=8, threshold=2,
                                       direct=direct) as t:
                    assert np.array_equal(t.read_batch(ids), ref[ids]), (backend, direct)
    finally:
        fuse.set_rules([])
    n = _fired(fuse, mode, before)
    _count(f"fuse {mode}", n)
    assert n >= 100


def test_fuse_device_gone_mid_session(tmp_path, table_dir):
    """The file system process dies under open tables (the device is gone): every backend
    reports TableIOError (ENOTCONN) at once instead of hanging, and closes cleanly."""
    why = fuse_unavailable()
    if why:
        pytest.skip(f"FUSE fault file system unavailable: {why}")
    root, _, ref = table_dir
    ids = np.random.default_rng(8).integers(0, N, (20, 24))
    with no_leaks():
        with FaultMount(root, tmp_path / "mnt", tmp_path) as m:
            tables = [Table(m.path("t.bin"), OFFSET, N, backend=b, readers=4, threshold=2) for b in BACKENDS]
            try:
                for t in tables:
                    assert np.array_equal(t.read_batch(ids), ref[ids])
                m.proc.kill()
                m.proc.wait(timeout=10)
                _count("fuse daemon killed", 1)
                for t in tables:
                    out = np.full((20, 24, 256), 6.0, np.float32)
                    t0 = time.monotonic()
                    with pytest.raises(TableIOError) as ei:
                        t.read_batch(ids, out=out)
                    assert time.monotonic() - t0 < 10
                    assert ei.value.errno_ in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO), ei.value
                    assert np.all(out == 6.0)
            finally:
                for t in tables:
                    t.close()


@pytest.fixture(scope="module")
def fuse_model(tmp_path_factory):
    """A small model on its own fault mount."""
    why = fuse_unavailable()
    if why:
        pytest.skip(f"FUSE fault file system unavailable: {why}")
    root = tmp_path_factory.mktemp("models")
    _build_model(root / "fm.gguf")
    work = tmp_path_factory.mktemp("fusem")
    try:
        with FaultMount(root, work / "mnt", work) as m:
            yield m
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_fuse_eio_during_prefetch(fuse_model, text_ids):
    model = EngramModel.open(fuse_model.path("fm.gguf"))
    t14 = model.info.tables[14]
    fuse_model.set_rules([{"name": "fm.gguf", "lo": t14.offset, "hi": t14.end, "mode": "eio", "every": 50}])
    before = fuse_model.stats()
    try:
        ids = text_ids[:2000]
        ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
        with no_leaks(), model.session() as s:
            p = s.prefill(ids, chunk_tokens=256)
            assert np.array_equal(p.rows(1, timeout=60), ref[1])  # the healthy table is complete
            with pytest.raises(TableIOError, match="Input/output error"):
                p.wait(14, timeout=60)
            assert p.progress[14] % 256 == 0 and p.progress[14] < 2000  # only whole chunks published
            got = p.progress[14]
            if got:
                assert np.array_equal(p.rows(14, 0, got, timeout=5), ref[14][:got])
    finally:
        fuse_model.set_rules([])
    n = _fired(fuse_model, "eio", before)
    _count("fuse eio (prefetch)", n)
    assert n >= 1


def test_fuse_slow_device_cancel_and_close_mid_flight(fuse_model, text_ids):
    """Reads of 10 ms each: cancel() and close() return after the chunk in flight, waiters get
    PrefetchCancelled, a short wait() times out instead of hanging."""
    model = EngramModel.open(fuse_model.path("fm.gguf"))
    lo = min(t.offset for t in model.info.tables.values())
    fuse_model.set_rules([{"name": "fm.gguf", "lo": lo, "mode": "delay", "seconds": 0.01}])
    before = fuse_model.stats()
    ids = np.resize(text_ids, 6000)
    try:
        with no_leaks():
            s = model.session(readers=4)
            p = s.prefill(ids, chunk_tokens=4)
            with pytest.raises(TimeoutError):
                p.wait(14, 6000, timeout=0.2)
            t0 = time.monotonic()
            p.cancel()
            assert time.monotonic() - t0 < 5
            with pytest.raises(PrefetchCancelled):
                p.wait(1, 6000, timeout=5)
            assert p.done
            # close from another thread while this one waits on a prefetch in flight
            p2 = s.prefill(ids, chunk_tokens=4)
            errors = []

            def waiter():
                try:
                    p2.wait(14, 6000, timeout=60)
                except BaseException as exc:  # noqa: BLE001 - inspected below
                    errors.append(exc)

            th = threading.Thread(target=waiter)
            th.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            s.close()
            th.join(30)
            assert not th.is_alive(), "waiter hung after close()"
            assert time.monotonic() - t0 < 5
            assert len(errors) == 1 and isinstance(errors[0], PrefetchCancelled)
            with pytest.raises(TableIOError, match="closed"):
                s.prefill(ids[:10])
    finally:
        fuse_model.set_rules([])
    n = _fired(fuse_model, "delay", before)
    _count("fuse delay", n)
    assert n >= 10


def test_close_while_other_threads_step(tmp_path, text_ids):
    """A server cancelling requests: sessions closed from another thread while their decode
    threads step.  Each step either returns the exact rows or raises TableIOError ("closed");
    nothing hangs, crashes or leaks."""
    path = _build_model(tmp_path / "race.gguf")
    model = EngramModel.open(path)
    ids = text_ids[:300]
    ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
    outcomes = {"rows": 0, "closed": 0}
    errors = []
    with no_leaks():
        for round_ in range(8):
            sessions = [model.session(readers=4) for _ in range(4)]

            def run(s):
                try:
                    for t, tok in enumerate(ids):
                        try:
                            rows = s.step(int(tok))
                        except TableIOError as exc:
                            assert "closed" in str(exc), exc
                            outcomes["closed"] += 1
                            return
                        assert all(np.array_equal(rows[lid], ref[lid][t]) for lid in model.layer_ids), t
                        outcomes["rows"] += 1
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
            for th in threads:
                th.start()
            time.sleep(0.005 * (round_ + 1))
            for s in sessions:
                s.close()
            for th in threads:
                th.join(30)
                assert not th.is_alive(), "a stepping thread hung after close()"
    assert not errors, errors[:3]
    assert outcomes["closed"] > 0 and outcomes["rows"] > 0, outcomes
    _count("sessions closed mid-step", outcomes["closed"])


# ====================================================================== signals
class Storm:
    """SIGALRM every ``interval_s`` seconds, counted as delivered.

    Python runs its handler only between bytecodes, so signals that arrive during one
    GIL-free read collapse into one handler call; the count here comes from the wakeup
    descriptor instead, to which the C-level handler writes one byte per delivered signal.
    """

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.delivered = 0

    def __enter__(self) -> "Storm":
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.old_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        self.old = signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, self.interval_s, self.interval_s)
        return self

    def take(self) -> int:
        """Signals delivered since the last call."""
        n = 0
        while True:
            try:
                got = os.read(self.r, 65536)
            except BlockingIOError:
                break
            if not got:
                break
            n += len(got)
        self.delivered += n
        return n

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, self.old)
        signal.set_wakeup_fd(self.old_fd)
        self.take()
        os.close(self.r)
        os.close(self.w)


@contextlib.contextmanager
def signal_storm(interval_s: float = 0.0002):
    """A :class:`Storm` for the block; ``hits[0]`` = signals delivered (read after the block)."""
    hits = [0]
    with Storm(interval_s) as storm:
        yield hits
        storm.take()
        hits[0] = storm.delivered


#: Signals that must land while each backend reads, and the time allowed to collect them.
STORM_SIGNALS, STORM_SECONDS = 200, 60.0


@pytest.mark.parametrize("backend", backend_params())
def test_signal_storm_during_reads_is_exact(table_dir, backend):
    """EINTR storms: a timer signal every 200 us while batches are read; reads go on until at
    least STORM_SIGNALS signals have landed during reads of this backend (counted as delivered,
    only those that arrived while a read was running), every row exact.  The FUSE variant
    (reads that wait in the kernel for the file system process) is in
    test_signal_storm_on_fuse_reads."""
    root, _, ref = table_dir
    rng = np.random.default_rng(6)
    during = reads = 0
    with no_leaks(), Table(root / "t.bin", OFFSET, N, backend=backend, readers=8, threshold=2) as t:
        with Storm(0.0002) as storm:
            deadline = time.monotonic() + STORM_SECONDS
            while during < STORM_SIGNALS and time.monotonic() < deadline:
                ids = rng.integers(0, N, (512, 24))
                storm.take()
                got = t.read_batch(ids)
                during += storm.take()
                assert np.array_equal(got, ref[ids]), (backend, reads)
                reads += 1
    _count("signals (SIGALRM)", during)
    assert during >= STORM_SIGNALS, f"only {during} signals landed during {reads} reads in {STORM_SECONDS} s"


def test_signal_storm_on_fuse_reads(fuse, table_dir):
    """The same storm while reads wait in the kernel for the FUSE file system process (delays of
    0.5 ms on every 7th read), on every backend that starts here."""
    _, _, ref = table_dir
    fuse.set_rules([{"name": "t.bin", "lo": OFFSET, "mode": "delay", "seconds": 0.0005, "every": 7}])
    rng = np.random.default_rng(7)
    try:
        with no_leaks(), Storm(0.0002) as storm:
            for backend in BACKENDS:
                during = 0
                with Table(fuse.path("t.bin"), OFFSET, N, backend=backend, readers=8, threshold=2) as t:
                    deadline = time.monotonic() + STORM_SECONDS
                    while during < STORM_SIGNALS and time.monotonic() < deadline:
                        ids = rng.integers(0, N, (256, 24))
                        storm.take()
                        got = t.read_batch(ids)
                        during += storm.take()
                        assert np.array_equal(got, ref[ids]), backend
                _count("signals (SIGALRM)", during)
                assert during >= STORM_SIGNALS, (backend, during)
    finally:
        fuse.set_rules([])


def test_signal_storm_during_session_steps(tmp_path, text_ids):
    path = _build_model(tmp_path / "sig.gguf")
    model = EngramModel.open(path)
    ids = text_ids[:400]
    ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
    with no_leaks(), signal_storm(0.0001) as hits, model.session() as s:
        for t, tok in enumerate(ids):
            rows = s.step(int(tok))
            assert all(np.array_equal(rows[lid], ref[lid][t]) for lid in model.layer_ids), t
        with model.session() as fresh:
            p = fresh.prefill(ids, chunk_tokens=32)
            assert np.array_equal(p.rows(14, timeout=60), ref[14])
    _count("signals (SIGALRM)", hits[0])
    assert hits[0] >= 50, hits[0]


# ====================================================================== readers that cannot start
@contextlib.contextmanager
def only_free_fds(n: int):
    """Lower RLIMIT_NOFILE so that only ``n`` more descriptors can be opened (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    top = max(int(x) for x in os.listdir("/proc/self/fd"))
    try:
        while True:  # fill every hole below the highest open descriptor
            fd = os.open(os.devnull, os.O_RDONLY)
            if fd > top:
                os.close(fd)
                break
            fillers.append(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1 + n, hard))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)


@pytest.mark.skipif("io_uring" not in BACKENDS, reason="io_uring does not start here (see engram info)")
def test_ring_that_cannot_start_falls_back_or_reports(table_dir):
    """No descriptor left for the ring (EMFILE): ``auto`` falls back to the pread pool and says
    why in ``fallback``; an explicit ``io_uring`` raises TableIOError."""
    root, _, ref = table_dir
    ids = np.random.default_rng(7).integers(0, N, (30, 24))
    with no_leaks():
        with only_free_fds(1):  # the table's own descriptor, nothing for the ring
            t = Table(root / "t.bin", OFFSET, N, readers=8, threshold=2)
        with t:
            assert t.backend == "pread" and "io_uring could not start" in t.fallback
            assert "Too many open files" in t.fallback
            assert np.array_equal(t.read_batch(ids), ref[ids]) and t.last_stats.backend == "pread"
            with only_free_fds(0):
                with pytest.raises(TableIOError, match="io_uring could not start: Too many open files") as ei:
                    TableGroup([t], 24, backend="io_uring")
                assert ei.value.errno_ == errno.EMFILE
                g = TableGroup([t], 24)  # auto: the pool
            with g:
                assert g.backend == "pread" and "Too many open files" in g.fallback
                assert np.array_equal(g.read_batch(ids), ref[ids])
        with only_free_fds(1):
            with pytest.raises(TableIOError, match="io_uring could not start") as ei:
                Table(root / "t.bin", OFFSET, N, backend="io_uring")
            assert ei.value.errno_ == errno.EMFILE
    _count("ring start (EMFILE)", 3)


IO_URING_SYSCTL = "/proc/sys/kernel/io_uring_disabled"


@pytest.mark.skipif("io_uring" not in BACKENDS, reason="io_uring does not start here (see engram info)")
def test_io_uring_disabled_by_the_kernel(tmp_path, table_dir, text_ids):
    """kernel.io_uring_disabled = 2, set only while the tables open (other processes share the
    machine) and restored after, even on failure: the probe and ``auto`` sessions fall back to the
    pread pool, name the setting, and keep reading exact rows after it is restored; an explicit
    io_uring backend reports the refusal with its errno."""
    if not os.path.exists(IO_URING_SYSCTL):
        pytest.skip("kernel without kernel.io_uring_disabled")
    root, _, ref = table_dir
    model = EngramModel.open(_build_model(tmp_path / "nouring.gguf"))
    ids = text_ids[:50]
    ref_rows = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
    with open(IO_URING_SYSCTL) as f:
        old = f.read().strip()
    try:
        with open(IO_URING_SYSCTL, "w") as f:
            f.write("2")
    except OSError as exc:
        pytest.skip(f"cannot set {IO_URING_SYSCTL}: {exc.strerror}")
    fds, threads = fd_count(), thread_count()
    try:
        ring = probe_backends(refresh=True)["io_uring"]
        with pytest.raises(TableIOError, match="io_uring could not start") as ei:
            Table(root / "t.bin", OFFSET, N, backend="io_uring")
        s = model.session()
    finally:
        with open(IO_URING_SYSCTL, "w") as f:
            f.write(old)
        probe_backends(refresh=True)  # the process's verdict follows the restored setting
    assert not ring.usable and "kernel.io_uring_disabled = 2" in ring.reason
    assert ring.errno in (errno.EPERM, errno.EACCES) and ei.value.errno_ == ring.errno
    with s:
        assert all(t.backend == "pread" and "kernel.io_uring_disabled = 2" in t.fallback for t in s.tables.values())
        for i, tok in enumerate(ids):
            rows = s.step(int(tok))
            assert all(np.array_equal(rows[lid], ref_rows[lid][i]) for lid in model.layer_ids)
        assert s.last_stats.backend == "pread"
    assert (fd_count(), thread_count()) == (fds, threads)
    _count("ring start (io_uring_disabled)", 2)


THREADS_CHILD = r'''
import json, os, resource, numpy as np
from engram import Table, TableIOError
from engram.codec import decode_rows
from tests.faults import thread_count, fd_count
from tests.tablefiles import rows_raw, write_table
path = os.environ["T_PATH"]
raw = rows_raw(500, seed=9)
write_table(path, raw, 0)
ref = decode_rows(raw)
res = {}
threads0, fds0 = thread_count(), fd_count()
def vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
# room for the pool's buffers (17 MB) but not for 1023 thread stacks (256 KiB each)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (40 << 20), hard))
try:
    try:
        Table(path, 0, 500, backend="pread", readers=1024)
        res["pread"] = None
    except TableIOError as e:
        res["pread"] = [str(e), e.errno_]
    res["threads_after_failure"] = thread_count() - threads0
    with Table(path, 0, 500, backend="serial") as t:   # the serial reader needs no thread
        res["serial_exact"] = bool(np.array_equal(t.read_rows(np.arange(500)), ref))
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
with Table(path, 0, 500, backend="pread", readers=8, threshold=2) as t:
    res["pread_after_exact"] = bool(np.array_equal(t.read_rows(np.arange(500)), ref))
res["leaks"] = [thread_count() - threads0, fd_count() - fds0]
print(json.dumps(res))
'''


def test_reader_threads_that_cannot_start(tmp_path):
    """Address space too small for the pool's thread stacks: an explicit pread backend raises
    TableIOError naming the errno, the threads already started are joined (none leak), and a
    serial table still reads."""
    res = run_child(THREADS_CHILD, env={"T_PATH": str(tmp_path / "t.bin")})
    msg, err = res["pread"]
    assert "pread could not start" in msg and err in (errno.EAGAIN, errno.ENOMEM), res
    assert res["threads_after_failure"] == 0
    assert res["serial_exact"] and res["pread_after_exact"]
    assert res["leaks"] == [0, 0]
    _count("pool start (RLIMIT_AS)", 1)
