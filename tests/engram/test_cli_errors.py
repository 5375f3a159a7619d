"""Ordinary failures of the engine's commands (issue 18.5) end in one line naming the file, never a traceback,
and leave nothing half-written: a read-only file system, a full disk (before and while writing), a missing
parent on a read-only one, a file where a folder must be, missing inputs, and Ctrl-C (exit 130).

Permission denied cannot be produced as root (root passes every permission check); a read-only mount
gives the same path through the code.  Mounting needs root: without it those tests skip, saying so.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import engram
from engram import OutputError, read_model, synth
from engram.cli import main
from engram.codec import decode_path
from engram.gguf import write as gguf_write
from engram.mixer import gate_path, project_path

from tests.modelfiles import SCALE, plan, write_header_only
from tests.mounts import tmpfs

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, args):
    """``engram ARGS`` in this process: (exit status, stderr), after checking stderr is one line at most."""
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return rc, err


def nothing_under(folder: Path):
    """The files a writer left in ``folder`` (none: no final name, no temporary folder)."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small model with real rows (its tables ~10 MB each) and its vocabulary."""
    d = tmp_path_factory.mktemp("src")
    (path,) = synth.write_model(plan(scale=0.0001), d / "src.gguf", synth.Fill(tables="all", projections=False),
                                progress=False)
    return path


# ====================================================================== engram info
def test_info_lists_every_kernel(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["decode_kernel"], info["gate_kernel"], info["project_kernel"]) == \
        (decode_path(), gate_path(), project_path())
    assert info["project_kernel"] in ("avx512", "avx2", "portable")
    assert main(["info"]) == 0
    assert f" project_kernel: {project_path()}" in capsys.readouterr().out


# ====================================================================== read-only, full, folders
def test_read_only_outputs(tmp_path, capsys, model):
    with tmpfs(tmp_path / "ro", "256m", read_only=True) as ro:  # room enough: the writes fail, not the check
        for args, path, shown in (
                (["synth", ro / "m.gguf", "--scale", SCALE, "--fill", "none", "--no-projections"], ro / "m.gguf",
                 "Read-only file system"),
                (["synth", ro / "sub" / "m.gguf", "--scale", SCALE, "--fill", "none", "--parents"],
                 ro / "sub" / "m.gguf", f"{ro / 'sub'}: Read-only file system"),  # the missing parent it could not make
                (["repair", model, ro / "r.gguf", "--no-progress"], ro / "r.gguf", "Read-only file system")):
            rc, err = run(capsys, args)
            assert rc == 2 and err == f"engram {args[0]}: error: {path}: cannot write ({shown})\n", err
        assert nothing_under(ro) == []


def test_a_full_disk_is_refused_before_writing(tmp_path, capsys, model):
    with tmpfs(tmp_path / "full", "1m") as full:
        rc, err = run(capsys, ["synth", full / "m.gguf", "--scale", SCALE, "--fill", "none", "--no-projections"])
        assert rc == 2 and f"{full / 'm.gguf'}: cannot write (writing it needs 5.5 MiB of disk and 64.0 MiB kept " \
                              f"free; {full} has 1.0 MiB free)" in err
        rc, err = run(capsys, ["repair", model, full / "r.gguf", "--no-progress"])
        assert rc == 2 and f"{full / 'r.gguf'}: cannot write (repairing it needs " in err
        assert nothing_under(full) == []
    with pytest.raises(OutputError) as e:
        synth.write_model(plan(full_size=True), tmp_path / "big" / "huge.gguf", synth.Fill(tables="all"),
                          progress=False, writing=synth.Writing(parents=True))
    assert e.value.errno == 28 and "writing it needs 189.4 GiB of disk" in str(e.value)
    assert str(e.value).endswith("(full-size tables: use Fill(tables='trace', trace=...) or Fill(tables='none'); engram synth: --fill)")
    assert nothing_under(tmp_path / "big") == []


def _fill_after_check(monkeypatch, module, leave: int):
    """After the writer's own check of the room, another writer takes all but ``leave`` bytes of the disk."""
    real = module.check_room

    def check_then_fill(path, need, *a, **k):
        real(path, need, *a, **k)
        free = shutil.disk_usage(path.parent).free
        with open(path.parent / "ballast", "wb") as f:
            f.truncate(0)
            os.posix_fallocate(f.fileno(), 0, free - leave)
    monkeypatch.setattr(module, "check_room", check_then_fill)


def test_a_disk_that_fills_while_writing(tmp_path, capsys, model, monkeypatch):
    """The disk fills after the check (another writer): the header (5.5 MiB) cannot be written, or the copy of
    the tables stops half-way; each ends in one line naming the file, and nothing of it stays."""
    with tmpfs(tmp_path / "fill", "80m") as fill:
        _fill_after_check(monkeypatch, synth, 1 << 20)
        rc, err = run(capsys, ["synth", fill / "m.gguf", "--scale", SCALE, "--fill", "none", "--no-projections",
                               "--no-progress"])
        assert rc == 2 and err == f"engram synth: error: {fill / 'm.gguf'}: cannot write (No space left on device)\n"
        assert nothing_under(fill) == ["ballast"]
    with tmpfs(tmp_path / "fill2", "120m") as fill:
        _fill_after_check(monkeypatch, gguf_write, 12 << 20)  # room for the header and half of the first table
        rc, err = run(capsys, ["repair", model, fill / "r.gguf", "--no-progress"])
        assert rc == 2 and err == f"engram repair: error: {fill / 'r.gguf'}: cannot write (No space left on device)\n"
        assert nothing_under(fill) == ["ballast"]


def test_a_file_where_a_folder_must_be(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for out, shown in ((tmp_path / "afile" / "m.gguf", f"{tmp_path / 'afile'} is a file, where a folder is needed"),
                       (tmp_path / "afile" / "x" / "m.gguf",
                        f"a part of {tmp_path / 'afile' / 'x'} is a file, where a folder is needed")):
        rc, err = run(capsys, ["synth", out, "--scale", SCALE, "--fill", "none", "--no-projections"])
        assert rc == 2 and err == f"engram synth: error: {out}: cannot write ({shown})\n", err
    assert (tmp_path / "afile").read_text() == "x"


def test_a_missing_parent_folder_is_refused_unless_parents(tmp_path, capsys, model):
    """As ``cp``: a missing folder is most often a mistyped path; it is named, and made only with --parents."""
    out = tmp_path / "new" / "deeper" / "m.gguf"
    for cmd in (["synth", out, "--scale", SCALE, "--fill", "none", "--no-projections", "--no-progress"],
                ["repair", model, out, "--no-progress"]):
        rc, err = run(capsys, cmd)
        assert rc == 2 and err == (f"engram {cmd[0]}: error: {out}: cannot write (the folder {out.parent} does not "
                                   f"exist; make it first, or pass --parents (in Python: parents=True, or "
                                   f"engram.synth.Writing(parents=True)))\n"), err
        assert not (tmp_path / "new").exists()
    with pytest.raises(OutputError) as e:
        synth.write_model(plan(), out, synth.Fill(tables="none", projections=False), progress=False)
    assert e.value.errno == errno.ENOENT and e.value.filename == str(out) and not (tmp_path / "new").exists()
    rc, _ = run(capsys, ["synth", out, "--scale", SCALE, "--fill", "none", "--no-projections", "--no-progress",
                         "--parents"])
    assert rc == 0 and read_model(out).layout.rows.tolist() == [194724, 199814]
    capsys.readouterr()
    rc, _ = run(capsys, ["repair", model, tmp_path / "b" / "r.gguf", "--no-progress", "--parents"])
    assert rc == 0 and read_model(tmp_path / "b" / "r.gguf").layout == read_model(model).layout
    capsys.readouterr()


def _nodes(tmp_path):
    """Paths that exist and are no regular file: a FIFO, a symlink to /dev/null, a folder, a socket, and (root
    only) a character device made with ``os.mknod`` under ``tmp_path`` (the same major/minor as /dev/null)."""
    fifo, link, folder = tmp_path / "fifo", tmp_path / "null-link", tmp_path / "folder"
    os.mkfifo(fifo)
    os.symlink("/dev/null", link)
    folder.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    nodes = [(fifo, "it is a FIFO"), (link, "it is a symlink to /dev/null, a character device"),
             (folder, "it is a directory"), (tmp_path / "sock", "it is a socket")]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        nodes.append((tmp_path / "chr", "it is a character device"))
    return nodes, sock


def _unchanged(path: Path, before: os.stat_result) -> bool:
    now = os.lstat(path)
    return (now.st_mode, now.st_ino, now.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)


def test_a_node_is_never_replaced(tmp_path, capsys, model):
    """synth and repair onto a FIFO, a device, a symlink to /dev/null, a folder or a socket: refused before
    anything is written (no temporary folder), the node as it was, one line naming the path and what it is."""
    work = tmp_path / "w"
    work.mkdir()
    nodes, sock = _nodes(work)
    try:
        if os.geteuid() != 0:
            print("not root: no character device made (os.mknod needs root); FIFO, symlink, folder, socket tested")
        for path, what in nodes:
            before = os.lstat(path)
            for cmd in (["synth", path, "--scale", SCALE, "--fill", "none", "--no-projections", "--no-progress"],
                        ["repair", model, path, "--no-progress"]):
                rc, err = run(capsys, cmd)
                assert rc == 2 and err == (f"engram {cmd[0]}: error: {path}: cannot write ({what}, not a regular "
                                           f"file; only a regular file is replaced)\n"), err
                assert _unchanged(path, before)
                assert [p.name for p in work.iterdir() if ".partial-" in p.name] == []
            with pytest.raises(OutputError) as e:
                gguf_write.repair_model(model, path, progress=False)
            assert e.value.filename == str(path) and what in str(e.value)
            with pytest.raises(OutputError):
                with gguf_write.atomic_outputs([path]):
                    raise AssertionError("atomic_outputs let the block run")  # pragma: no cover
            assert _unchanged(path, before)
    finally:
        sock.close()


def test_a_node_made_while_writing_is_not_replaced(tmp_path):
    """The rule holds again at the rename: a FIFO made under the final name while the file was written stays."""
    out = tmp_path / "x.gguf"
    with pytest.raises(OutputError, match=r"x.gguf: cannot write \(it is a FIFO, not a regular file"):
        with gguf_write.atomic_outputs([out]) as (tmp,):
            tmp.write_bytes(b"data")
            os.mkfifo(out)
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and nothing_under(tmp_path) == ["x.gguf"]


def test_a_regular_file_and_a_symlink_to_one_are_replaced(tmp_path):
    old = tmp_path / "old.gguf"
    old.write_bytes(b"old")
    link = tmp_path / "link.gguf"
    link.symlink_to(old)
    for out in (old, link):
        with gguf_write.atomic_outputs([out]) as (tmp,):
            tmp.write_bytes(b"new")
        assert out.read_bytes() == b"new" and not out.is_symlink()


# ====================================================================== missing inputs
def test_missing_inputs_name_the_file(tmp_path, capsys, model):
    none = tmp_path / "none"
    (small,) = write_header_only(plan(), tmp_path / "m.gguf")
    for args, words in ((["inspect", none / "m.gguf"], f"{none / 'm.gguf'}: no such model file"),
                        (["repair", none / "m.gguf", tmp_path / "r.gguf"], f"{none / 'm.gguf'}: no such model file"),
                        (["lookup", none / "m.gguf", "--text", "a"], f"{none / 'm.gguf'}: no such model file"),
                        (["lookup", small, "--text", "a", "--tokenizer", none / "t.json"],
                         f"tokenizer {none / 't.json'}: cannot read (No such file or directory)"),
                        (["lookup", small, "--tokens", none / "ids.txt"],
                         f"{none / 'ids.txt'}: cannot read the token file: No such file or directory"),
                        (["hash", "--text", "a", "--tokenizer", none / "t.json"],
                         f"cannot load tokenizer from {none / 't.json'}"),
                        (["synth", tmp_path / "o.gguf", "--scale", SCALE, "--tokenizer", none / "t.json"],
                         f"cannot load tokenizer from {none / 't.json'}"),
                        (["synth", tmp_path / "o.gguf", "--scale", SCALE, "--trace-tokens", none / "ids.npy"],
                         f"{none / 'ids.npy'}: cannot read the token file")):
        rc, err = run(capsys, args)
        assert rc == 2 and err.startswith(f"engram {args[0]}: error: ") and words in err, (args, err)
    assert not (tmp_path / "o.gguf").exists() and not (tmp_path / "r.gguf").exists()


# ====================================================================== Ctrl-C
SLOW = """
    import dataclasses, sys, time
    from engram import synth
    from engram.gguf import write
    real_pwrite, real_copy, build = synth._pwrite_all, write._copy_bytes, synth.build_model
    def slow_pwrite(fd, data, offset):
        real_pwrite(fd, data, offset)
        time.sleep(0.02)
    def slow_copy(*a):
        real_copy(*a)
        time.sleep(0.02)
    synth._pwrite_all, write._copy_bytes, write.COPY_CHUNK = slow_pwrite, slow_copy, 1 << 16
    synth.build_model = lambda *a, writing, **k: build(*a, writing=dataclasses.replace(writing, chunk_bytes=1 << 16),
                                                       **k)
    from engram.cli import main
    sys.exit(main({argv!r}))
"""


def _interrupt_mid_write(argv, folder: Path, min_bytes: int = 1 << 20):
    """Run ``engram ARGV`` (writes slowed down) and press Ctrl-C once its partial folder holds ``min_bytes``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SLOW.format(argv=[str(a) for a in argv]))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        parts = [d for d in folder.iterdir() if ".partial-" in d.name] if folder.exists() else []
        if any(f.stat().st_blocks * 512 >= min_bytes for d in parts for f in d.iterdir()):
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_ctrl_c_while_writing_leaves_nothing(tmp_path, model):
    out = tmp_path / "o" / "m.gguf"
    rc, _, err = _interrupt_mid_write(["synth", out, "--scale", "0.0001", "--no-projections", "--no-progress",
                                       "--parents"], out.parent)
    assert (rc, err) == (130, "engram synth: interrupted\n")
    assert nothing_under(out.parent) == []
    out = tmp_path / "r" / "r.gguf"
    rc, _, err = _interrupt_mid_write(["repair", model, out, "--no-progress", "--parents"], out.parent)
    assert (rc, err) == (130, "engram repair: interrupted\n")
    assert nothing_under(out.parent) == []


def test_ctrl_c_during_a_lookup(tmp_path, model):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(i) for i in range(100, 20100)))
    code = textwrap.dedent("""
        import sys, time
        from engram import model
        step = model.Session.step
        def slow(self, t):
            time.sleep(0.001)
            return step(self, t)
        model.Session.step = slow
        from engram.cli import main
        print("started", flush=True)
        sys.exit(main(sys.argv[1:]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, "lookup", str(model), "--tokens", str(ids), "--no-gates",
                             "--json"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "started\n"
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    *before, last = err.splitlines()
    assert (proc.returncode, last, out) == (130, "engram lookup: interrupted", "")
    # with io_uring refused (ENGRAM_DISABLE_IO_URING=1, a seccomp filter) the pool fallback says so first
    assert all(line.startswith("io_uring could not start: ") for line in before), err


def test_engine_api_names_the_errors():
    assert issubclass(engram.OutputError, OSError) and issubclass(engram.OutputError, engram.EngramError)
    assert issubclass(engram.VocabularyError, engram.TokenError)


def test_a_plugin_that_cannot_load_says_why_and_what_to_install(capsys):
    import argparse
    import importlib.metadata

    from engram.cli import _add_plugin

    parser = argparse.ArgumentParser(prog="engram")
    sub = parser.add_subparsers(dest="command")
    ep = importlib.metadata.EntryPoint(name="demo", value="sim.no_such_module:add", group="engram.commands")
    _add_plugin(sub, "demo", ep)
    args = parser.parse_args(["demo", "--quick"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("engram demo: error: the command could not be loaded from sim.no_such_module:add "
                          "(ModuleNotFoundError: No module named 'sim.no_such_module'")
    assert "pip install 'engram[sim]'" in err
