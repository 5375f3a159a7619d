"""Interrupted writes leave nothing half-made (issue 17.6): ``engram synth`` (one file and split sets)
and ``engram repair`` write under temporary names and rename when complete.

A real writer process is started and killed with SIGKILL while it writes (its writes are slowed
down inside the child so the kill lands mid-way); afterwards no file exists under a final name.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engram import read_model, synth
from engram.gguf import atomic_outputs, repair_model
from engram.gguf import write as gguf_write

from tests.modelfiles import plan

ROOT = Path(__file__).resolve().parents[2]


def _partials(folder: Path):
    return sorted(p for p in folder.iterdir() if ".partial-" in p.name)


def _start(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_mid_write(proc: subprocess.Popen, folder: Path, min_bytes: int, timeout: float = 120.0) -> None:
    """SIGKILL ``proc`` once a file in its partial folder holds ``min_bytes`` of data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the writer ended before it was killed (exit {proc.returncode}):\n{out}\n{err}")
        for d in _partials(folder):
            if any(f.stat().st_blocks * 512 >= min_bytes for f in d.iterdir()):
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                assert proc.returncode == -signal.SIGKILL
                return
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the writer wrote nothing in time")


SLOW_SYNTH = """
    import time
    from engram import synth
    from tests.modelfiles import plan
    real = synth._pwrite_all
    def slow(fd, data, offset):
        real(fd, data, offset)
        time.sleep(0.02)
    synth._pwrite_all = slow
    synth.write_model(plan(scale=0.0001, shards={shards}), {out!r}, synth.Fill(tables="all", projections=False),
                      progress=False, writing=synth.Writing(chunk_bytes=1 << 16, direct_io=False))
    print("finished")
"""


@pytest.mark.parametrize("shards", [1, 3])
def test_killed_synth_leaves_no_final_file(tmp_path, shards):
    out = tmp_path / "m.gguf"
    finals = synth.shard_names(out, shards)
    proc = _start(SLOW_SYNTH.format(shards=shards, out=str(out)))
    _kill_mid_write(proc, tmp_path, 1 << 20)
    assert not any(p.exists() for p in finals), [p.name for p in tmp_path.iterdir()]
    (left,) = _partials(tmp_path)  # what the killed writer leaves: its private folder
    assert left.name == f".{finals[0].name}.partial-{proc.pid}"
    # a complete run afterwards writes every final name; the killed run's folder stays untouched
    written = synth.write_model(plan(scale=0.0001, shards=shards), out, synth.Fill(tables="none", projections=False),
                                progress=False)
    assert written == finals and all(p.exists() for p in finals)
    assert read_model(finals[-1]).paths == tuple(finals)
    assert _partials(tmp_path) == [left]


def test_failing_synth_removes_its_temporaries(tmp_path, monkeypatch):
    """An exception mid-write (ENOSPC on the 3rd data write) leaves no final name and no partial folder."""
    calls = []
    real = synth._pwrite_all

    def failing(fd, data, offset):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(synth, "_pwrite_all", failing)
    out = tmp_path / "f.gguf"
    with pytest.raises(OSError, match="No space left"):
        synth.write_model(plan(scale=0.0001, shards=2), out, synth.Fill(tables="all", projections=False),
                          progress=False, writing=synth.Writing(chunk_bytes=1 << 16, direct_io=False))
    assert list(tmp_path.iterdir()) == []


def test_atomic_outputs_renames_first_path_last(tmp_path, monkeypatch):
    """A split set is complete once its first shard exists: the first rename is the last one."""
    order = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(Path(b).name), real(a, b)))
    names = [tmp_path / f"x-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    with atomic_outputs(names) as temps:
        for t in temps:
            t.write_bytes(b"data")
        assert not any(n.exists() for n in names)
    assert order == ["x-00002-of-00003.gguf", "x-00003-of-00003.gguf", "x-00001-of-00003.gguf"]
    assert all(n.read_bytes() == b"data" for n in names) and _partials(tmp_path) == []


SLOW_REPAIR = """
    import time
    from engram.gguf import write
    write.COPY_CHUNK = 1 << 16
    real = write._copy_bytes
    def slow(*a):
        real(*a)
        time.sleep(0.02)
    write._copy_bytes = slow
    write.repair_model({src!r}, {out!r}, progress=False)
    print("finished")
"""


def test_killed_repair_leaves_no_final_file(tmp_path):
    src = tmp_path / "src" / "legacy.gguf"
    src.parent.mkdir()
    p = plan(scale=0.0001)
    p.metadata = {k.replace("deepseek41.engram.", "deepseek4.engram."): v for k, v in p.metadata.items()}
    synth.write_model(p, src, synth.Fill(tables="all", projections=False), progress=False)
    out = tmp_path / "fixed.gguf"
    proc = _start(SLOW_REPAIR.format(src=str(src), out=str(out)))
    _kill_mid_write(proc, tmp_path, 1 << 20)
    assert not out.exists() and len(_partials(tmp_path)) == 1
    # and the same repair run to the end gives a file that reads with the current keys
    assert repair_model(src, out, progress=False) == [out]
    assert read_model(out).sources["primes"].kind == "key"
    assert gguf_write.partial_dir(out).exists() is False
