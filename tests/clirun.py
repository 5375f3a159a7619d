"""The one line a failed ``engram`` command prints, checked: exit code 2, no traceback."""

from __future__ import annotations

from engram.cli import main


def cli(capsys, args) -> str:
    """Run ``engram ARGS``; assert exit 2 and one line without a traceback; return that line."""
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()
