"""Ordinary failures of the simulator's commands end as one line naming the file, exit 2, never a traceback:
a read-only folder, a full disk, a file where a folder must be, a missing input, a folder given as a table."""

from __future__ import annotations

from engram.cli import main
from tests.mounts import tmpfs

STUDY = '[study]\nname = "e"\n[fixed]\ntrace_limit = 100\nsteps = 50\ncompute_ms = 10.0\n[grid]\nthreshold = [8, 256]\n'


def run(capsys, args):
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def test_read_only_outputs(tmp_path, capsys):
    study = tmp_path / "s.toml"
    study.write_text(STUDY)
    with tmpfs(tmp_path / "ro", "64k", read_only=True) as ro:
        for args, path in ((["sim", "trace", "--limit", "50", "--out", str(ro / "t.npz")], ro / "t.npz"),
                           (["sim", "device", "seed-apple-m3-ultra", "--save", str(ro / "d.json")], ro / "d.json"),
                           (["sim", "sweep", str(study), "--out", str(ro / "x.csv"), "--quiet"], ro / "x.csv"),
                           (["report", "--out", str(ro / "r"), "--quick", "--quiet"], ro / "r")):
            rc, err = run(capsys, args)
            assert rc == 2 and f"{path}: " in err and "Read-only file system" in err, (args, err)
            assert ".tmp" not in err  # the file asked for, not the temporary one an atomic write goes through


def test_missing_inputs_and_wrong_kinds(tmp_path, capsys):
    study = tmp_path / "s.toml"
    study.write_text(STUDY)
    for args, words in ((["sim", "sweep", str(tmp_path / "none.toml")], "none.toml: cannot read study"),
                        (["sim", "decode", "--limit", "50", "--device", str(tmp_path / "d.json"), "--compute-ms", "40"],
                         "d.json: cannot read"),
                        (["sim", "decode", "--trace", str(tmp_path / "t.txt"), "--compute-ms", "40"], "no file"),
                        (["sim", "capacity", str(study)], "not a capacity study"),
                        (["report", "--sweep", str(tmp_path), "--out", str(tmp_path / "r")], "is a folder, not a table"),
                        (["sim", "sweep", str(study), "--out", "/dev/null"], "/dev/null: cannot write a table over it"),
                        (["sim", "sweep", str(study), "--out", str(tmp_path)], "cannot write a table over it")):
        rc, err = run(capsys, args)
        assert rc == 2 and words in err, (args, err)


def test_a_full_disk_keeps_the_rows_written(tmp_path, capsys):
    study = tmp_path / "s.toml"
    study.write_text(STUDY.replace("threshold = [8, 256]", "threshold = [8, 256]\nreaders = [1, 2, 4, 8, 16, 32]"))
    # the disk: the pages of the table's metadata as a finished run writes it (with room for an unfinished
    # run's longer lists) and one page for the rows, which need more than one
    assert run(capsys, ["sim", "sweep", str(study), "--out", str(tmp_path / "whole.csv"), "--jobs", "1", "--quiet"])[0] == 0
    assert (tmp_path / "whole.csv").stat().st_size > 4096
    pages = -(-((tmp_path / "whole.csv.meta.json").stat().st_size + 512) // 4096) + 1
    with tmpfs(tmp_path / "full", f"{4 * pages}k") as full:
        rc, err = run(capsys, ["sim", "sweep", str(study), "--out", str(full / "t.csv"), "--jobs", "1", "--quiet"])
        assert rc == 2 and f"{full / 't.csv'}: cannot write (No space left on device)" in err
