"""Sweep tables: one row per point, written as CSV (full float precision) or Parquet, and read back."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from engram.errors import ArgumentError, FormatError

from ..io import load_json
from .study import AXES

__all__ = ["read_table", "write_table"]


def write_table(rows: Sequence[Mapping[str, Any]], path: Union[str, os.PathLike],
                columns: Optional[Sequence[str]] = None) -> Path:
    """Write rows as ``.csv`` (default) or ``.parquet`` (needs ``pyarrow``); floats keep full precision.

    Raises
    ------
    ArgumentError
        Parquet asked without ``pyarrow`` installed.
    """
    path = Path(path)
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ModuleNotFoundError:
            raise ArgumentError(f"{path}: Parquet output needs pyarrow (pip install pyarrow); "
                                "or write .csv") from None
        pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path)
        return path
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([repr(v) if isinstance(v, float) else v for v in (r.get(c, "") for c in cols)])
    return path


def _parse_cell(s: str) -> Any:
    if s == "":
        return ""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_table(path: Union[str, os.PathLike]) -> Tuple[List[Dict[str, Any]], dict]:
    """Rows of a table written by :func:`write_table` (numbers parsed) and its ``.meta.json`` (or ``{}``).

    String axes keep their type from the metadata (a device named ``"1"`` stays a string).

    Raises
    ------
    FormatError
        Unreadable file.
    """
    path = Path(path)
    meta_path = Path(str(path) + ".meta.json")
    meta = load_json(meta_path) if meta_path.is_file() else {}
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            t = pq.read_table(path).to_pydict()
            cols = list(t)
            rows = [{c: t[c][i] for c in cols} for i in range(len(t[cols[0]]) if cols else 0)]
        else:
            with open(path, newline="", encoding="utf-8") as f:
                rows = [{k: (v if k in AXES and AXES[k][0] is str else _parse_cell(v)) for k, v in r.items()}
                        for r in csv.DictReader(f)]
    except OSError as exc:
        raise FormatError(f"{path}: cannot read table ({exc.strerror})") from None
    except ModuleNotFoundError:
        raise FormatError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    return rows, meta
