"""sim.core.progress: a bar on a terminal, plain periodic lines elsewhere, nothing when off."""

from __future__ import annotations

import io
import re

import pytest

from sim.core.progress import Progress, ProgressOutput, progress, progress_mode
from sim.decode import DecodeRun


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal():
    out = io.StringIO()
    with progress(3, "sweep demo", "point", output=ProgressOutput(stream=out, interval=0.0)) as p:
        assert p.mode == "lines"
        p.update(1, "point 0")
        p.update(1, "point 1")
        p.update(1, "point 2")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "sweep demo: 3 points"
    assert re.fullmatch(r"sweep demo: 1/3 points \(33%\) after \d+ s, about \d+ s left; last: point 0", lines[1])
    assert re.fullmatch(r"sweep demo: 2/3 points \(67%\) after \d+ s, about \d+ s left; last: point 1", lines[2])
    assert re.fullmatch(r"sweep demo: 3/3 points in \d+ s", lines[3]) and len(lines) == 4


def test_lines_are_periodic_not_per_item():
    out = io.StringIO()
    p = progress(1000, "capacity", "search", output=ProgressOutput(stream=out, interval=3600.0))
    for _ in range(999):
        p.update()
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == ["capacity: 1000 searches", lines[-1]] and "999/1000 searches (100%)" in lines[-1]


def test_a_bar_on_a_terminal_and_nothing_when_off():
    tty = Terminal()
    with progress(2, "sweep", "point", output=ProgressOutput(stream=tty)) as p:
        assert p.mode == "bar"
        p.update(2)
    assert "\r" in tty.getvalue() and "sweep:" in tty.getvalue() and "/2 " in tty.getvalue()  # a tqdm bar
    quiet = io.StringIO()
    with Progress(2, "sweep", "point", mode=False, output=ProgressOutput(stream=quiet)) as p:
        p.update(2)
        p.write("hello")
    assert quiet.getvalue() == ""
    with Progress(5, "sweep", "point", mode="lines", output=ProgressOutput(stream=Terminal()), initial=2) as p:
        assert p.mode == "lines" and p.n == 2  # lines even on a terminal when asked


def test_a_bad_interval_is_refused_naming_it():
    from engram.errors import ArgumentError
    for bad in (-1.0, float("nan"), "10"):
        with pytest.raises(ArgumentError, match="interval"):
            ProgressOutput(interval=bad)


def test_modes():
    assert progress_mode(True) == progress_mode(None) == "auto" and progress_mode(False) == "off"
    assert progress_mode("lines") == "lines"
    with pytest.raises(ValueError, match="progress must be one of"):
        progress_mode("loud")


def test_a_delay_keeps_short_runs_quiet_and_eta_can_be_left_out():
    out = io.StringIO()
    with progress(3, "decode (fast)", "session", output=ProgressOutput(stream=out), delay=3600.0) as p:
        p.update(3)
    assert out.getvalue() == ""
    out = io.StringIO()
    with progress(3, "decode (fast)", "session", output=ProgressOutput(stream=out, interval=0.0), eta=False) as p:
        p.update(1)
        p.update(1)
    assert "left" not in out.getvalue() and "decode (fast): 1/3 sessions (33%) after" in out.getvalue()
    tty = Terminal()
    with progress(3, "decode (fast)", "session", output=ProgressOutput(stream=tty), eta=False) as p:
        p.update(1)
    assert "\r" in tty.getvalue() and "<" not in tty.getvalue()  # tqdm's remaining-time field is left out


def test_sim_decode_off_a_terminal_prints_plain_lines(monkeypatch):
    """simulate_decode(progress=True) off a terminal: sim.core.progress's plain lines, no tqdm bar, no time left."""
    import sim.decode.model as model
    from sim.decode import simulate_decode
    from sim.trace import CODE_SOURCE, load_trace
    out = io.StringIO()
    made = []

    def capture(*a, **k):
        assert k["eta"] is False and k["delay"] > 0
        made.append(progress(*a, **{**k, "delay": 0.0, "output": ProgressOutput(stream=out)}))
        return made[-1]

    monkeypatch.setattr(model, "progress_bar", capture)
    simulate_decode(load_trace(CODE_SOURCE, limit=200), "seed-apple-m3-ultra",
                    run=DecodeRun(sessions=3, steps=50, progress=True))
    lines = out.getvalue().splitlines()
    assert made and made[0].mode == "lines" and "\r" not in out.getvalue()
    assert lines[0] == "decode (fast): 3 sessions" and re.fullmatch(r"decode \(fast\): 3/3 sessions in \d+ s", lines[-1])
