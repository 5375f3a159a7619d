"""Progress of long runs: a tqdm bar on a terminal, plain periodic lines anywhere else.

A tqdm bar redraws itself with carriage returns; written to a file or a CI log
it leaves a line per redraw (tens of kilobytes for one sweep).  Off a terminal
:func:`progress` therefore prints a plain line at most every ``interval``
seconds (and at the start and the end), each one complete on its own::

    sweep demo: 12/40 points (30%) after 25 s, about 58 s left; last: point 11

Modes: ``"auto"`` (a bar on a terminal, lines elsewhere), ``"bar"``,
``"lines"`` (never a bar), ``"off"``.  ``True`` means ``"auto"`` and
``False`` means ``"off"``.  ``delay``: nothing is shown before that many
seconds (a short run stays quiet); ``eta=False``: no time-left estimate, for
items that do not finish at an even pace (decode sessions running side by side
all finish near the end).  ``text``: work whose count says little of the time
it takes (a capacity search's probes of one session and of thousands) says
its own state instead of ``n/total`` and the time left (a callable of the
elapsed seconds and whether it is the closing line; on a bar, after it).
Everything goes to the ``stream`` of a :class:`ProgressOutput` (default
standard error), never to standard output, so ``--json`` output stays clean.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, TextIO, Union

from tqdm import tqdm

from engram.errors import ArgumentError

__all__ = ["PLAIN_INTERVAL_S", "Progress", "ProgressOutput", "progress", "progress_label", "progress_mode"]

#: Seconds between two plain progress lines.
PLAIN_INTERVAL_S = 10.0

_MODES = ("auto", "bar", "lines", "off")


def progress_mode(value: Union[bool, str, None]) -> str:
    """The mode of a ``progress`` argument: ``True``/``None`` -> ``"auto"``, ``False`` -> ``"off"``, or a mode.

    Raises
    ------
    ArgumentError
        Not a mode (a ValueError too).
    """
    if value is None or value is True:
        return "auto"
    if value is False:
        return "off"
    if value not in _MODES:
        raise ArgumentError(f"progress must be one of {', '.join(_MODES)} or a bool, got {value!r}")
    return value


@dataclass(frozen=True)
class ProgressOutput:
    """Where a :class:`Progress` is shown and how often its plain lines come.

    Attributes
    ----------
    stream : text stream, optional
        Where the bar or the lines go (default: standard error at the time the progress starts; never
        standard output, so ``--json`` output stays clean).
    interval : float
        Seconds between two plain lines (at least 0; default :data:`PLAIN_INTERVAL_S`).

    Raises
    ------
    ArgumentError
        ``interval`` is negative or not a finite number.
    """

    stream: Optional[TextIO] = None
    interval: float = PLAIN_INTERVAL_S

    def __post_init__(self) -> None:
        if (isinstance(self.interval, bool) or not isinstance(self.interval, (int, float))
                or not math.isfinite(self.interval) or self.interval < 0):
            raise ArgumentError(f"interval must be a finite number of seconds >= 0, got {self.interval!r}")


class Progress:
    """Counts finished items of a known total and shows it (see the module docstring).

    Use as a context manager or call :meth:`close`; :meth:`update` after each item.  ``output``: where
    it is shown and how often (:class:`ProgressOutput`).
    """

    def __init__(self, total: int, desc: str, unit: str = "item", *, mode: Union[bool, str] = "auto",
                 output: ProgressOutput = ProgressOutput(), initial: int = 0, delay: float = 0.0, eta: bool = True,
                 text: Optional[Callable[[float, bool], str]] = None):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.text = text
        self.delay, self.eta = float(delay), bool(eta)
        self.n = int(initial)
        self.stream = output.stream if output.stream is not None else sys.stderr
        self.interval = float(output.interval)
        mode = progress_mode(mode)
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "lines"
        self.mode = mode
        self._t0 = time.monotonic()
        self._last = self._t0
        self._closed = False
        self._bar = None
        self._n0 = self.n
        self._opened = False
        if mode == "bar":
            fmt = None if self.eta else "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]"
            if text is not None:
                fmt = "{l_bar}{bar}| {postfix}"
            self._bar = tqdm(total=self.total, initial=self.n, desc=desc, unit=unit, file=self.stream, leave=False,
                             delay=self.delay, bar_format=fmt)
        elif mode == "lines" and self.delay <= 0:
            self._open()

    def _open(self) -> None:
        """The opening plain line."""
        self._opened = True
        done = f", {self._n0} already done" if self._n0 else ""
        if self.text is not None:
            self._line(f"{self.desc}: {self.text(time.monotonic() - self._t0, False)}")
            return
        self._line(f"{self.desc}: {self.total} {self._units(self.total)}{done}")

    def _units(self, n: int) -> str:
        if n == 1:
            return self.unit
        return self.unit + ("es" if self.unit.endswith(("s", "sh", "ch", "x")) else "s")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _status(self, note: str = "") -> str:
        elapsed = time.monotonic() - self._t0
        if self.text is not None:
            return f"{self.desc}: {self.text(elapsed, False)}" + (f"; last: {note}" if note else "")
        pct = f" ({self.n / self.total:.0%})" if self.total else ""
        text = f"{self.desc}: {self.n}/{self.total} {self._units(self.total)}{pct} after {elapsed:.0f} s"
        ran = self.n - self._n0
        if self.eta and 0 < ran and self.n < self.total:
            text += f", about {elapsed / ran * (self.total - self.n):.0f} s left"
        return text + (f"; last: {note}" if note else "")

    def update(self, n: int = 1, note: str = "") -> None:
        """``n`` more items finished; ``note`` names the last one (shown on plain lines)."""
        self.n += n
        if self._bar is not None:
            if self.text is not None:
                self._bar.set_postfix_str(self.text(time.monotonic() - self._t0, False), refresh=False)
            self._bar.update(n)
        elif self.mode == "lines":
            now = time.monotonic()
            if not self._opened:
                if now - self._t0 < self.delay:
                    return
                self._open()
            if now - self._last >= self.interval and (self.n < self.total or self.text is not None):
                self._last = now
                self._line(self._status(note))

    def set_total(self, total: int) -> None:
        """A new total: for work whose size is an estimate that tightens as it goes on (a capacity search's
        most probes still to ask); never below the items already done.  The time left follows it."""
        self.total = max(int(total), self.n)
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def write(self, text: str) -> None:
        """A message between progress lines (above the bar on a terminal)."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self._line(text)

    def close(self) -> None:
        """Remove the bar, or print the closing line."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "lines":
            if not self._opened:
                if time.monotonic() - self._t0 < self.delay:
                    return
                self._open()
            if self.text is not None:
                self._line(f"{self.desc}: {self.text(time.monotonic() - self._t0, True)}")
                return
            self._line(self._status() if self.n < self.total
                       else f"{self.desc}: {self.n}/{self.total} {self._units(self.total)} "
                            f"in {time.monotonic() - self._t0:.0f} s")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_label(kind: str, name: str) -> str:
    """The label of a named run's progress, without a word twice: the words of ``kind`` the ``name`` does not
    hold, then the name (``("capacity", "capacity")`` -> ``"capacity"``, ``("serve capacity", "serve-policy")``
    -> ``"capacity serve-policy"``, ``("sweep", "demo")`` -> ``"sweep demo"``)."""
    if not name:
        return kind
    held = set(name.lower().replace("-", " ").replace("_", " ").split())
    return " ".join([w for w in kind.split() if w.lower() not in held] + [name])


def progress(total: int, desc: str, unit: str = "item", *, mode: Union[bool, str] = "auto",
             output: ProgressOutput = ProgressOutput(), initial: int = 0, delay: float = 0.0, eta: bool = True,
             text: Optional[Callable[[float, bool], str]] = None) -> Progress:
    """A :class:`Progress` of ``total`` items (``initial`` already done) labelled ``desc``, shown on ``output``."""
    return Progress(total, desc, unit, mode=mode, output=output, initial=initial, delay=delay, eta=eta, text=text)
