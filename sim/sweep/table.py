"""Sweep tables: one row per point, written as CSV (full float precision) or Parquet, and read back.

A run writes its table as the points finish (:class:`TableWriter`): each row
is appended to a CSV file and flushed as soon as its point is done, and the
metadata beside it (``TABLE.meta.json``) says ``"complete": false`` with the
points still missing.  When every point is in, the table is rewritten in point
order (CSV or Parquet, atomically) and the metadata says ``"complete": true``.
A run that stops early -- interrupted, a lost machine, a full disk -- leaves
its finished rows, and :func:`read_table` reads them back (a resumed run
starts from them).  Parquet tables are built as ``TABLE.partial.csv`` and
written at the end.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from engram.errors import ArgumentError, FormatError

from sim.core.io import (OutputError, atomic_output, check_output_folder, load_json, output_error, read_text,
                         write_json)
from .study import AXES

__all__ = ["TableWriter", "check_metrics", "check_table_target", "meta_path", "partial_path", "read_table", "same_axis_value", "write_table"]

#: Seconds between two rewrites of an unfinished table's metadata (its list of missing points).
META_EVERY_S = 5.0


def meta_path(path: Union[str, os.PathLike]) -> Path:
    """``TABLE.meta.json``: the metadata beside a table."""
    return Path(str(path) + ".meta.json")


def partial_path(path: Union[str, os.PathLike]) -> Path:
    """Where the rows of an unfinished table are appended: the table itself when it is a ``.csv``, else
    ``TABLE.partial.csv``."""
    path = Path(path)
    return path if path.suffix != ".parquet" else Path(str(path) + ".partial.csv")


def _check_target(path: Path) -> None:
    """Refuse to replace anything but a regular file (a device, a folder) with a table."""
    if path.exists() and not path.is_file():
        raise OutputError(f"{path}: cannot write a table over it (not a regular file)")


def check_table_target(path: Union[str, os.PathLike]) -> Path:
    """Refuse, before any work, a table path that cannot take a table: the table, its unfinished rows or its
    metadata would replace something other than a regular file (a device, a folder), or its folder is a file.

    Raises
    ------
    OutputError
        Names the path.
    """
    path = Path(path)
    for p in dict.fromkeys((path, partial_path(path), meta_path(path))):
        _check_target(p)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{parent}: cannot write a table in it (not a folder)")
            break
    return path


def _line(values: Sequence[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow([repr(v) if isinstance(v, float) else v for v in values])
    return buf.getvalue()


def write_table(rows: Sequence[Mapping[str, Any]], path: Union[str, os.PathLike],
                columns: Optional[Sequence[str]] = None) -> Path:
    """Write rows as ``.csv`` (default) or ``.parquet`` (needs ``pyarrow``), atomically; floats keep full precision.

    The table goes to ``PATH.tmp`` and replaces ``PATH`` in one rename.

    Raises
    ------
    ArgumentError
        Parquet asked without ``pyarrow`` installed.
    OutputError
        The table or its folder cannot be written (names the path and the reason).
    """
    path = Path(path)
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    _check_target(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ModuleNotFoundError:
            raise ArgumentError(f"{path}: Parquet output needs pyarrow (pip install pyarrow); "
                                "or write .csv") from None
    check_output_folder(path)
    with atomic_output(path) as tmp:
        if path.suffix == ".parquet":
            pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), tmp)
        else:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                f.write(_line(cols))
                for r in rows:
                    f.write(_line([r.get(c, "") for c in cols]))
    return path


class TableWriter:
    """A table written as its points finish (see the module docstring).

    Parameters
    ----------
    path : path
        The table (``.csv`` or ``.parquet``).
    columns : sequence of str
        Its columns, in order.
    meta : dict
        The metadata written beside it; ``complete``, ``points_done`` and ``missing`` are added.
    points : int
        Points of the whole run (indices ``0 .. points - 1`` in the ``point`` column).
    done : sequence of dict
        Rows already finished (a resumed run): written first.
    key : str
        The column holding a row's index (default ``point``).

    Raises
    ------
    OutputError
        The table or its folder cannot be written.
    """

    def __init__(self, path: Union[str, os.PathLike], columns: Sequence[str], meta: Mapping[str, Any],
                 points: int, done: Sequence[Mapping[str, Any]] = (), key: str = "point"):
        self.path = Path(path)
        self.key = key
        self.partial = partial_path(self.path)
        self.columns = list(columns)
        self.meta = dict(meta)
        self.points = int(points)
        self.rows: Dict[int, Mapping[str, Any]] = {}
        self._meta_at = 0.0
        _check_target(self.partial)
        check_output_folder(self.partial)
        try:
            self._f = open(self.partial, "w", newline="", encoding="utf-8")
            self._f.write(_line(self.columns))
            self._f.flush()
        except OSError as exc:
            raise output_error(self.partial, exc) from None
        for r in done:
            self.add(r, meta=False)
        self.write_meta(False)

    def missing(self) -> List[int]:
        """Points not written yet."""
        return [i for i in range(self.points) if i not in self.rows]

    def write_meta(self, complete: bool, **extra: Any) -> None:
        """Rewrite ``TABLE.meta.json`` with ``complete`` and the missing points.

        Raises
        ------
        OutputError
        """
        self.meta.update(extra)
        self.meta.update(complete=bool(complete), points_done=len(self.rows), missing=self.missing())
        if not complete:
            self.meta["partial_rows"] = str(self.partial)
        else:
            self.meta.pop("partial_rows", None)
        write_json(meta_path(self.path), self.meta)
        self._meta_at = time.monotonic()

    def add(self, row: Mapping[str, Any], *, meta: bool = True) -> None:
        """Append a finished point's row and flush it to disk (the metadata every few seconds).

        Raises
        ------
        OutputError
            The row cannot be written (a full disk): the rows before it stay.
        """
        try:
            self._f.write(_line([row.get(c, "") for c in self.columns]))
            self._f.flush()
        except OSError as exc:
            raise output_error(self.partial, exc) from None
        self.rows[int(row[self.key])] = row
        if meta and time.monotonic() - self._meta_at >= META_EVERY_S:
            self.write_meta(False)

    def close(self, **extra: Any) -> None:
        """Stop writing an unfinished table: its rows stay, the metadata lists the missing points.

        Never raises: a table that cannot be closed (a full disk) keeps the rows already flushed.
        """
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            self.write_meta(False, **extra)

    def finish(self, **extra: Any) -> Path:
        """Every point is in: write the table in point order and ``"complete": true``; return its path.  The
        order and the indices are the rows' own now (a capacity search numbers its probes in rounds once they
        are all in: :class:`sim.sweep.capacity.ProbeRounds`).

        Raises
        ------
        OutputError
        """
        with contextlib.suppress(OSError):
            self._f.close()
        self.rows = {int(r[self.key]): r for r in self.rows.values()}
        rows = [self.rows[i] for i in sorted(self.rows)]
        write_table(rows, self.path, self.columns)
        if self.partial != self.path:
            with contextlib.suppress(OSError):
                self.partial.unlink()
        self.write_meta(not self.missing(), **extra)
        return self.path


def _parse_cell(s: Optional[str]) -> Any:
    if s is None or s == "":
        return ""
    if s in ("True", "False"):
        return s == "True"
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_table(path: Union[str, os.PathLike], metrics: Sequence[str] = ()) -> Tuple[List[Dict[str, Any]], dict]:
    """Rows of a table written by :func:`write_table` or :class:`TableWriter` (numbers parsed) and its
    ``.meta.json`` (or ``{}``).

    String axes keep their type (a device named ``"1"`` stays a string).  An
    unfinished Parquet table is read from ``TABLE.partial.csv``; its metadata
    says ``"complete": false``.  With ``metrics`` (result columns, e.g.
    :data:`sim.sweep.METRICS`), the table is checked for a reader that uses them
    (:func:`check_metrics`); without, rows cut short are read as they are (a
    resumed run skips them).

    Raises
    ------
    FormatError
        Unreadable file; with ``metrics``, a table without rows, without one of
        the columns, or with a cell of one that is not a finite number >= 0
        (names the file, line and column).
    """
    path = Path(path)
    mp = meta_path(path)
    meta = load_json(mp) if mp.is_file() else {}
    if meta.get("complete") is False and not path.is_file() and partial_path(path).is_file():
        path = partial_path(path)
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            t = pq.read_table(path).to_pydict()
            cols = list(t)
            rows = [{c: t[c][i] for c in cols} for i in range(len(t[cols[0]]) if cols else 0)]
        else:
            f = io.StringIO(read_text(path, "table"), newline="")
            rows = [{k: ((v or "") if k in AXES and AXES[k][0] is str else _parse_cell(v))
                     for k, v in r.items() if k is not None} for r in csv.DictReader(f)]
    except OSError as exc:
        raise FormatError(f"{path}: cannot read table ({exc.strerror})") from None
    except ModuleNotFoundError:
        raise FormatError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    if metrics:
        check_metrics(rows, metrics, path)
    return rows, meta


def check_metrics(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], path: Union[str, os.PathLike]) -> None:
    """Refuse a table a reader of ``metrics`` cannot use: no rows, a metric column missing, or a cell of one
    that is empty (a row cut short), not a number, not finite or negative.

    Lines are counted as in the CSV file: the header is line 1, row ``i`` line ``i + 2``.

    Raises
    ------
    FormatError
        Names the file, the line and column, and the value.
    """
    if not rows:
        raise FormatError(f"{path}: the table has no rows (empty, or a header only)")
    missing = [m for m in metrics if m not in rows[0]]
    if missing:
        raise FormatError(f"{path}: line 1: no column {missing[0]!r} (a result column of every sweep table)")
    for i, r in enumerate(rows):
        for m in metrics:
            v = r.get(m)
            if v == "" or v is None:
                raise FormatError(f"{path}: line {i + 2}: column {m!r} is empty (the row is cut short)")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise FormatError(f"{path}: line {i + 2}: column {m!r} = {v!r} is not a number")
            if not (math.isfinite(v) and v >= 0):
                raise FormatError(f"{path}: line {i + 2}: column {m!r} = {v:g} must be a finite number >= 0")


def same_axis_value(stored: Any, value: Any) -> bool:
    """An axis value read back from a table equals the study's (an unset axis, ``None``, is an empty cell)."""
    unset = (None, "")
    return stored == value or (stored in unset and value in unset)
