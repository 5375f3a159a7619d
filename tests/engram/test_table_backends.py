"""Read backends at run time (issues 12 and 18): which start and read here, the process's
fallback from the io_uring ring, and the platform guards of the C readers.

The ring is refused three real ways: the kernel (``kernel.io_uring_disabled``, in
tests/engram/test_faults.py), the documented environment switch ``ENGRAM_DISABLE_IO_URING``,
and an ``LD_PRELOAD`` shim over ``syscall()`` that lets the ring start but turns every read it
submits into an invalid opcode, so the kernel completes it with ``-EINVAL`` (what some old
kernels and seccomp filters do).  Each runs in a child process, so the verdict of this test
process on the ring is untouched.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engram._native import reader as _reader
from engram.backends import available_backends, probe_backends, ring_build, usable_backends
from tests.faults import SHIM_RING_EINVAL, build_shim, run_child

NATIVE = Path(_reader.__file__).resolve().parent
RING_BUILT = "io_uring" in available_backends()
needs_ring = pytest.mark.skipif(not RING_BUILT, reason=f"io_uring not in this build: {ring_build()}")


def test_probe_backends_reports_every_backend():
    st = probe_backends()
    assert set(st) == {"serial", "pread", "io_uring"}
    assert st["serial"].usable and st["pread"].usable
    ring = st["io_uring"]
    assert ring.built == RING_BUILT
    assert ring.usable == ("io_uring" in usable_backends())
    assert (ring.reason is None) == ring.usable and (ring.errno == 0) == ring.usable
    if RING_BUILT:
        assert ring_build().startswith("raw io_uring system calls (<linux/io_uring.h> of Linux ")


# ---------------------------------------------------------------- refused by the environment
ENV_CHILD = r'''
import errno, json, logging, os, numpy as np
from engram import Table, TableIOError, EngramModel, synth
from engram.backends import probe_backends, usable_backends, auto_backend
from engram.codec import decode_rows
from tests.modelfiles import token_map
from tests.tablefiles import rows_raw, write_table

records = []
class Count(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
logging.getLogger("engram").addHandler(Count())
path = os.environ["T_PATH"]
raw = rows_raw(2000, seed=3)
write_table(path, raw, 4096)
ref = decode_rows(raw)
ids = np.random.default_rng(0).integers(0, 2000, (40, 24))
res = {}
with Table(path, 4096, 2000, readers=8, threshold=2) as t:
    res["auto"] = [t.backend, t.fallback, bool(np.array_equal(t.read_batch(ids), ref[ids])), t.last_stats.backend]
with Table(path, 4096, 2000) as t:
    res["second"] = [t.backend, t.fallback]
try:
    Table(path, 4096, 2000, backend="io_uring")
    res["explicit"] = None
except TableIOError as e:
    res["explicit"] = [str(e), e.errno_]
m = os.environ["M_PATH"]
synth.build_model(m, synth.ModelShape(scale=0.0001, token_map=token_map()), synth.Fill(projections=False),
                  progress=False)
with EngramModel.open(m).session() as s:
    s.step(1000)
    res["session"] = [s.last_stats.backend] + [t.backend for t in s.tables.values()]
res["usable"] = list(usable_backends())
res["auto_backend"] = list(auto_backend())
res["warnings"] = records
print(json.dumps(res))
'''


@needs_ring
def test_environment_switch_refuses_the_ring(tmp_path):
    """ENGRAM_DISABLE_IO_URING=1: the ring is refused as kernel.io_uring_disabled=2 would (EPERM):
    auto tables, groups and sessions read with the pread pool and say why, one warning per process;
    an explicit io_uring raises TableIOError naming io_uring and the errno."""
    res = run_child(ENV_CHILD, env={"ENGRAM_DISABLE_IO_URING": "1", "T_PATH": str(tmp_path / "t.bin"),
                                    "M_PATH": str(tmp_path / "m.gguf")})
    why = "io_uring could not start: Operation not permitted (EPERM) (ENGRAM_DISABLE_IO_URING=1)"
    assert res["auto"] == ["pread", why, True, "pread"]
    assert res["second"] == ["pread", why]
    assert res["explicit"] == [f"{tmp_path / 't.bin'}: {why}", errno.EPERM]
    assert res["session"] == ["pread", "pread", "pread"]
    assert res["usable"] == ["serial", "pread"] and res["auto_backend"] == ["pread", why]
    assert len(res["warnings"]) == 1 and res["warnings"][0].startswith(why), res["warnings"]


@needs_ring
def test_engram_info_reports_what_auto_uses_now():
    exe = Path(sys.executable).with_name("engram")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "engram.cli"]
    env = dict(os.environ, ENGRAM_DISABLE_IO_URING="1")
    r = subprocess.run(cmd + ["info", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["auto_backend"] == "pread" and "ENGRAM_DISABLE_IO_URING" in info["auto_reason"]
    assert info["usable_backends"] == ["serial", "pread"] and info["read_backends"][-1] == "io_uring"
    assert info["backends"]["io_uring"]["errno"] == errno.EPERM and r.stderr == ""
    r = subprocess.run(cmd + ["info"], capture_output=True, text=True, env=env, timeout=60)
    assert "auto_backend: pread" in r.stdout and "auto_reason: io_uring could not start" in r.stdout
    if "io_uring" in usable_backends():
        r = subprocess.run(cmd + ["info", "--json"], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "ENGRAM_DISABLE_IO_URING"})
        info = json.loads(r.stdout)
        assert info["auto_backend"] == "io_uring" and "a ring started and read" in info["auto_reason"]


# ---------------------------------------------------------------- a ring that starts but cannot read
RING_CHILD = r'''
import errno, json, logging, os, numpy as np
from engram import Table, TableGroup, TableIOError
from engram.backends import ring_verdict
from engram.codec import decode_rows
from tests.faults import preloaded_shim
from tests.tablefiles import rows_raw, write_table

records = []
class Count(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
logging.getLogger("engram").addHandler(Count())
shim = preloaded_shim()
path = os.environ["T_PATH"]
raw = rows_raw(3000, seed=5)
write_table(path, raw, 4096 + 100)
ref = decode_rows(raw)
ids = np.random.default_rng(1).integers(0, 3000, (50, 24))
res = {}
engine = os.environ["ENGINE"]
if os.environ["WHEN"] == "open":
    shim.engram_fault_set(int(os.environ["MODE"]), b"t-ring.bin", 0, 1 << 62, 1, -1, 1)
    with Table(path, 4196, 3000, readers=8, threshold=2, engine=engine) as t:
        res["auto"] = [t.backend, t.fallback, bool(np.array_equal(t.read_batch(ids), ref[ids])),
                       t.last_stats.backend]
        with TableGroup([t], 24) as g:
            res["group"] = [g.backend, g.fallback is not None, g.engine is not None and g.engine is t.engine]
    try:
        Table(path, 4196, 3000, backend="io_uring", engine=engine)
        res["explicit"] = None
    except TableIOError as e:
        res["explicit"] = [str(e), e.errno_]
else:
    a = Table(path, 4196, 3000, readers=8, threshold=2, engine=engine)     # proves the ring: it reads
    b = Table(path, 4196, 3000, readers=8, threshold=2, engine=engine)
    x = Table(path, 4196, 3000, backend="io_uring", readers=8, threshold=2, engine=engine)
    res["one_engine"] = a.engine is not None and a.engine is b.engine is x.engine
    res["before"] = [a.backend, b.backend, x.backend, ring_verdict().usable]
    shim.engram_fault_set(int(os.environ["MODE"]), b"t-ring.bin", 0, 1 << 62, 1, -1, 1)
    out = np.full(ids.shape + (256,), 3.0, np.float32)
    a.read_batch(ids, out=out)                               # fails on the ring, re-read on the pool
    res["first"] = [bool(np.array_equal(out, ref[ids])), a.backend, a.last_stats.backend, a.fallback]
    res["other"] = [bool(np.array_equal(b.read_batch(ids), ref[ids])), b.backend, b.last_stats.backend]
    try:
        x.read_batch(ids, out=out)
        res["explicit"] = None
    except TableIOError as e:
        res["explicit"] = [str(e), e.errno_, e.row, e.offset]
    res["fresh"] = Table(path, 4196, 3000, engine=engine).backend
    for t in (a, b, x):
        t.close()
res["fired"] = shim.engram_fault_fired()
res["warnings"] = records
print(json.dumps(res))
'''


def _ring_child(tmp_path, when, engine):
    try:
        lib = build_shim(tmp_path)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return run_child(RING_CHILD, preload=lib, env={"T_PATH": str(tmp_path / "t-ring.bin"), "WHEN": when,
                                                            "MODE": str(SHIM_RING_EINVAL), "ENGINE": engine})


@needs_ring
@pytest.mark.skipif("io_uring" not in usable_backends(), reason="io_uring does not start here (see engram info)")
@pytest.mark.parametrize("engine", ["private", "shared"])
def test_ring_that_starts_but_cannot_read_is_caught_at_open(tmp_path, engine):
    """io_uring_setup works, every read completes with -EINVAL: auto proves the ring with a real read
    at open and falls back to the pool (saying why, once); an explicit io_uring raises at open.
    The same with the tables' own readers and through the shared engine of their device."""
    res = _ring_child(tmp_path, "open", engine)
    backend, why, exact, used = res["auto"]
    assert (backend, exact, used) == ("pread", True, "pread")
    assert why.startswith("io_uring starts but its reads fail: Invalid argument (EINVAL) reading row 0 at file "
                          "offset 4196, which the pread pool read"), why
    assert res["group"] == ["pread", True, engine == "shared"]
    msg, err = res["explicit"]
    assert err == errno.EINVAL and "io_uring starts but its reads fail: Invalid argument" in msg
    assert res["fired"] >= 1
    assert len(res["warnings"]) == 1 and res["warnings"][0].startswith(why), res["warnings"]


@needs_ring
@pytest.mark.skipif("io_uring" not in usable_backends(), reason="io_uring does not start here (see engram info)")
@pytest.mark.parametrize("engine", ["private", "shared"])
def test_ring_that_fails_mid_run_moves_the_process_to_the_pool(tmp_path, engine):
    """The ring read at open, then its reads start failing (-EINVAL): the failing batch is re-read on the
    pool (exact rows), every auto reader of the process moves to the pool with one warning, new auto
    tables start there; an explicit io_uring table reports TableIOError naming io_uring, row and offset.
    The same with the tables' own readers and through the shared engine of their device."""
    res = _ring_child(tmp_path, "mid-run", engine)
    assert res["one_engine"] == (engine == "shared")
    assert res["before"] == ["io_uring", "io_uring", "io_uring", True]
    exact, backend, used, why = res["first"]
    assert (exact, backend, used) == (True, "pread", "pread")
    assert "io_uring starts but its reads fail: Invalid argument (EINVAL)" in why and "re-read on the pread pool" in why
    assert res["other"] == [True, "pread", "pread"]
    msg, err, row, offset = res["explicit"]
    assert err == errno.EINVAL and offset == 4196 + row * 264
    assert f"reading row {row} at file offset {offset} through io_uring failed: Invalid argument" in msg
    assert res["fresh"] == "pread"
    assert len(res["warnings"]) == 1, res["warnings"]


# ---------------------------------------------------------------- platform guards of the C readers
PROGRAM = r'''
#include "readers.h"
int main(void) {
    int err;
    engram_ioerr e;
    engram_job job = {0};
    engram_client c = {0};
    engram_run_info info;
    engram_engine_stats st;
    uint8_t buf[4096];
    engram_ring *g = engram_ring_create(2, 4096, 512, 0, &err);
    engram_engine *x = engram_engine_create(4, 8, 64, -1, &err);
    engram_engine *own = engram_engine_create(2, 8, 0, 1, &err);
    engram_read_serial(&job, 0, &e);
    engram_engine_grow(x, 8);
    engram_engine_set_ring_batch(x, 32);
    engram_engine_start_pool(x);
    engram_engine_ready_ring(x, 4, 4096, 512);
    engram_engine_run(x, &c, &job, 4, ENGRAM_RUN_AUTO, 4096, 512, buf, &e, &info);
    engram_engine_set_pool_threads(own, 1);
    engram_engine_start_pool(own);
    engram_engine_run(own, &c, &job, 2, ENGRAM_RUN_POOL, 4096, 512, buf, &e, &info);
    engram_engine_run(own, &c, &job, 2, ENGRAM_RUN_RING, 4096, 512, buf, &e, &info);
    engram_engine_drop_rings(own);
    engram_engine_get_stats(x, &st);
    engram_engine_fork_prepare(x);
    engram_engine_fork_parent(x);
    if (err == 12345) engram_engine_fork_child(x);
    engram_engine_destroy(x);
    engram_engine_destroy(own);
    engram_ring_abandon(g);
    engram_ring_destroy(g);
    return ENGRAM_HAVE_URING;
}
'''


def _compile(tmp_path, *flags) -> set:
    """Undefined symbols of PROGRAM compiled with ``flags``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm on PATH")
    src, obj = tmp_path / "p.c", tmp_path / "p.o"
    src.write_text(PROGRAM)
    r = subprocess.run([cc, "-c", "-O1", "-Wall", "-Werror", *flags, f"-I{NATIVE}", str(src), "-o", str(obj)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    nm = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in nm.splitlines() if line.strip()}


def test_readers_build_without_linux_calls(tmp_path):
    """As on a POSIX system that is not Linux (macOS, the BSDs): the readers and the shared engine
    compile, and the object calls no io_uring system call, mmap or preadv2 (posix_fadvise is guarded by
    POSIX_FADV_DONTNEED, which macOS does not define)."""
    linux = _compile(tmp_path, "-D_FORTIFY_SOURCE=0")
    other = _compile(tmp_path, "-U__linux__", "-U__linux", "-Ulinux", "-U__gnu_linux__", "-D_FORTIFY_SOURCE=0")
    forbidden = {"syscall", "mmap", "mmap64", "munmap", "preadv2", "preadv64v2"}
    assert not other & forbidden, other & forbidden
    assert {"pread", "pread64"} & other and {"pthread_create"} <= other
    if RING_BUILT:
        assert {"syscall", "mmap"} <= linux | {"mmap64"} and "syscall" in linux
    no_ring = _compile(tmp_path, "-DENGRAM_NO_URING")
    assert "syscall" not in no_ring
