"""The exact reads of a trace as an fio I/O log, to try a candidate SSD for real (issue 14.8).

A decode step of the engine reads the 48 rows of its token (SPEC §8) as one
batch, with ``O_DIRECT`` through aligned bounce buffers (``engram.Table``,
``engram/_native/reader.pyx``): per table, the row ids are sorted, each
distinct row is read once, and a row's bytes ``[offset + row * 264, ... + 264)``
become the aligned span of the blocks holding them; spans that overlap or touch
are read as one request while it stays within the engine's span cap
(``max(MAX_SPAN_BYTES, 2 * block)``).  :func:`plan_reads` reproduces those
requests step by step (a pure NumPy twin, checked against the engine's own read
counts), and :class:`IoPlan` writes them as a log that ``fio --read_iolog``
replays:

- format 2 (``fio version 2 iolog``): the reads in step order, as fast as fio's
  queue depth allows (``--iodepth``: the engine's readers or ring depth);
- format 3 (``fio version 3 iolog``, fio >= 3.31), with ``step_us``: every read
  of step ``k`` stamped ``1 + k * step_us`` microseconds, so fio issues a
  step's reads together once per decode step (the compute time between steps;
  fio replays open loop: a slow device falls behind instead of slowing the
  steps, which the simulator's decode model does).  fio 3.33 measures the
  delay from its last synchronous issue, so ``--ioengine=psync`` holds the
  timestamps while asynchronous engines may run ahead of them.

The table offsets are those of a model file (:func:`model_tables`, the file's
own offsets; a model of another layout, such as a reduced-scale synthetic one,
gets the trace's tokens hashed with its own layout), or of the released V4.1
Flash file (:func:`released_tables`: tables at byte offsets 162,955,640,832 and
264,333,279,232 of a 365.7 GB file, SPEC §6).  Replay on a device with
``fio --name=engram --read_iolog=FILE --replay_redirect=/dev/nvmeXn1 --direct=1
--ioengine=io_uring --iodepth=48 --readonly``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np

from engram import Hasher, Layout, Table, read_model
from engram._native.reader import MAX_SPAN_BYTES
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError, RowRangeError, TableIOError
from engram.gguf import MODEL_ALIGNMENT
from engram.synth import REAL_TABLE_OFFSET

from .base import Trace, default_layout
from .wrap import session_offsets

__all__ = ["DEFAULT_BLOCK", "RELEASED_FILE", "IoPlan", "TableExtent", "engine_block", "model_tables", "plan_reads",
           "released_tables", "span_cap"]

#: Alignment of direct reads unless told otherwise: a 4 KiB block (SPEC §8; the engine uses the
#: device's logical block size).
DEFAULT_BLOCK = 4096
#: File name written for the released layout's tables (replay with ``--replay_redirect=DEVICE``).
RELEASED_FILE = "DeepSeek-V4.1-Flash.gguf"


@dataclass(frozen=True)
class TableExtent:
    """Where one layer's table lies: rows ``[0, rows)`` at bytes ``offset + row * 264`` of ``path``."""

    layer_id: int
    path: str
    offset: int
    rows: int


def released_tables(path: str = RELEASED_FILE, layout: Optional[Layout] = None) -> List[TableExtent]:
    """The tables of the released V4.1 Flash file (SPEC §6): the first at byte 162,955,640,832, each next
    one at the first multiple of ``general.alignment`` (16384) after the previous table's last row."""
    layout = layout if layout is not None else default_layout()
    out, offset = [], REAL_TABLE_OFFSET
    for lid, rows in zip(layout.layer_ids, layout.rows):
        out.append(TableExtent(int(lid), str(path), int(offset), int(rows)))
        end = offset + int(rows) * ROW_BYTES
        offset = -(-end // MODEL_ALIGNMENT) * MODEL_ALIGNMENT
    return out


def model_tables(model: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]):
    """``(tables, layout, token_map)`` of a model file (or its shards), from its headers only.

    Raises
    ------
    FormatError, TableIOError
        Not a valid model (see :func:`engram.read_model`).
    """
    info = read_model(model)
    tables = [TableExtent(int(lid), str(Path(t.path).resolve()), int(t.offset), int(t.rows))
              for lid, t in sorted(info.tables.items(), key=lambda kv: list(info.layout.layer_ids).index(kv[0]))]
    return tables, info.layout, info.token_map


def engine_block(table: TableExtent) -> Optional[int]:
    """The alignment the engine reads ``table`` with on this machine (``engram.Table.alignment``: the
    device's logical block size under ``O_DIRECT``), or ``None`` where ``O_DIRECT`` is refused.

    Raises
    ------
    TableIOError
        The file cannot be opened or is too short.
    """
    with Table(table.path, table.offset, table.rows, backend="serial") as t:
        return int(t.alignment) if t.direct else None


def span_cap(block: int) -> int:
    """Largest span the engine reads in one request for ``block``-aligned reads (``reader.pyx``)."""
    return max(MAX_SPAN_BYTES, 2 * block if block > 1 else 2 * ROW_BYTES)


# =================================================================== planning
def _step_spans(offsets: np.ndarray, block: int, cap: int):
    """Aligned spans ``(start, length)`` of one table's sorted distinct row offsets, merged as the engine does."""
    starts = (offsets // block) * block
    ends = -(-(offsets + ROW_BYTES) // block) * block
    out_s, out_l = [], []
    cur_s = cur_e = -1
    for s, e in zip(starts.tolist(), ends.tolist()):
        if cur_s >= 0 and s <= cur_e and e - cur_s <= cap:
            cur_e = max(cur_e, e)
            continue
        if cur_s >= 0:
            out_s.append(cur_s)
            out_l.append(cur_e - cur_s)
        cur_s, cur_e = s, e
    out_s.append(cur_s)
    out_l.append(cur_e - cur_s)
    return out_s, out_l


@dataclass
class IoPlan:
    """The device reads of every decode step of one or more sessions.

    Attributes
    ----------
    files : list of str
        The files read (one per distinct table path).
    session, step, file, offset, length : numpy.ndarray
        int64 ``[reads]``: per read, its session, its step within the session,
        the index into ``files``, and its byte span (block-aligned).
    steps, sessions, block : int
        Steps per session, sessions, alignment of the reads.
    rows : int
        Distinct rows read (summed over steps; a row read at two steps counts twice).
    source : str
        The trace's source.
    """

    files: List[str]
    session: np.ndarray
    step: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    steps: int
    sessions: int
    block: int
    rows: int
    source: str = ""

    @property
    def reads(self) -> int:
        return int(self.offset.size)

    @property
    def bytes(self) -> int:
        return int(self.length.sum())

    def session_plan(self, s: int) -> "IoPlan":
        """The reads of session ``s`` alone."""
        m = self.session == s
        return IoPlan(self.files, self.session[m], self.step[m], self.file[m], self.offset[m], self.length[m],
                      self.steps, 1, self.block, -1, self.source)

    def lines(self, version: int = 2, step_us: Optional[float] = None) -> List[str]:
        """The fio iolog of these reads, one line each (all sessions in one log, session after session).

        Raises
        ------
        ArgumentError
            ``version`` other than 2 or 3, or ``step_us`` with version 2 (fio's version 2 ``wait``
            changed meaning across fio releases; timestamps are format 3's).
        """
        if version not in (2, 3):
            raise ArgumentError(f"fio iolog version must be 2 or 3, got {version}")
        if version == 2 and step_us is not None:
            raise ArgumentError("step timing needs iolog version 3 (timestamps); version 2 replays as fast as it can")
        period = float(step_us or 0.0)
        if period < 0:
            raise ArgumentError(f"step_us must be >= 0, got {step_us}")
        stamp = (lambda t: "") if version == 2 else (lambda t: f"{t} ")
        out = [f"fio version {version} iolog"]
        # version 3: fio measures a line's delay from the previous stamp once one is non-zero; start at 1 us
        for f in self.files:
            out += [f"{stamp(1)}{f} add", f"{stamp(1)}{f} open"]
        ts = 1 + np.round(self.step.astype(np.float64) * period).astype(np.int64)
        names = self.files
        for t, fi, off, ln in zip(ts.tolist(), self.file.tolist(), self.offset.tolist(), self.length.tolist()):
            out.append(f"{stamp(t)}{names[fi]} read {off} {ln}")
        last = int(ts[-1]) if ts.size else 1
        out += [f"{stamp(last)}{f} close" for f in self.files]
        return out

    def write(self, path: Union[str, os.PathLike], version: int = 2, step_us: Optional[float] = None) -> Path:
        """Write :meth:`lines` to ``path`` (atomically: a temporary file renamed) and return the path.

        Raises
        ------
        ArgumentError
            As :meth:`lines`.
        TableIOError
            The file cannot be written (names it).
        """
        path = Path(path)
        text = "\n".join(self.lines(version, step_us)) + "\n"
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            raise TableIOError(f"{path}: cannot write the I/O log ({exc.strerror})") from None
        return path

    def summary(self) -> dict:
        per_step = self.reads / max(1, self.steps * self.sessions)
        return {"files": self.files, "sessions": self.sessions, "steps": self.steps, "block": self.block,
                "reads": self.reads, "bytes": self.bytes, "rows": self.rows, "reads_per_step": per_step,
                "bytes_per_step": self.bytes / max(1, self.steps * self.sessions), "source": self.source}


def _rows_for(trace: Trace, layout: Layout, token_map: Optional[np.ndarray], trace_layout: Layout) -> np.ndarray:
    """uint32 ``[T, layers, columns]``: the trace's rows under ``layout`` (its own rows when it was hashed
    with ``layout``, else its tokens hashed again with it, sequence by sequence)."""
    if layout == trace_layout:
        return trace.rows
    hasher = Hasher(layout, token_map)
    bounds = list(trace.starts) + [trace.steps]
    out = np.empty((trace.steps, layout.layers, layout.columns), np.uint32)
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = hasher.hash(trace.tokens[a:b])
    return out


def plan_reads(trace: Trace, tables: Optional[Sequence[TableExtent]] = None, *, layout: Optional[Layout] = None,
               token_map: Optional[np.ndarray] = None, trace_layout: Optional[Layout] = None,
               block: int = DEFAULT_BLOCK, steps: Optional[int] = None, sessions: int = 1) -> IoPlan:
    """The engine's device reads for ``sessions`` sessions of ``steps`` decode steps of ``trace``.

    Parameters
    ----------
    trace : Trace
        Token ids and row ids per step.
    tables : sequence of TableExtent, optional
        One per layer of the layout, in layer order; default :func:`released_tables`.
    layout, token_map :
        The layout of ``tables`` (default V4.1 Flash) and its token map.
    trace_layout : Layout, optional
        The layout the trace's rows were hashed with (default V4.1 Flash, as
        every trace source makes them); when it is not ``layout`` the trace's
        tokens (token ids) are hashed again with ``layout`` and ``token_map``.
    block : int
        Alignment of the reads in bytes, a power of two >= 512 (the engine's
        ``Table.alignment``: the device's logical block size under ``O_DIRECT``).
    steps : int, optional
        Steps per session (default the trace length); sessions start at
        :func:`sim.trace.wrap.session_offsets` and wrap around the trace as in
        :func:`sim.decode.session_reads`.
    sessions : int
        Sessions (>= 1).

    Returns
    -------
    IoPlan

    Raises
    ------
    ArgumentError
        Bad block, steps, sessions, or tables that do not match the layout.
    RowRangeError
        A row id outside its table (names the step, layer and column).
    """
    layout = layout if layout is not None else default_layout()
    tables = list(tables) if tables is not None else released_tables(layout=layout)
    if isinstance(block, bool) or block < 512 or block & (block - 1):
        raise ArgumentError(f"block must be a power of two >= 512 bytes, got {block}")
    if len(tables) != layout.layers:
        raise ArgumentError(f"{len(tables)} tables given for a layout of {layout.layers} layers")
    if trace.steps == 0:
        raise ArgumentError("the trace has no steps")
    steps = trace.steps if steps is None else int(steps)
    if steps < 1 or sessions < 1:
        raise ArgumentError(f"steps and sessions must be >= 1, got {steps} and {sessions}")
    rows = _rows_for(trace, layout, token_map, trace_layout if trace_layout is not None else default_layout())
    _check_rows(rows, tables)
    files = list(dict.fromkeys(t.path for t in tables))
    fidx = [files.index(t.path) for t in tables]
    cap = span_cap(block)
    cols: dict = {"session": [], "step": [], "file": [], "offset": [], "length": []}
    distinct = 0
    for s, first in enumerate(session_offsets(trace.steps, sessions).tolist()):
        for k in range(steps):
            step_rows = rows[(first + k) % trace.steps]
            for li, t in enumerate(tables):
                u = np.unique(step_rows[li].astype(np.int64))
                distinct += u.size
                sp, ln = _step_spans(t.offset + u * ROW_BYTES, block, cap)
                n = len(sp)
                cols["session"] += [s] * n
                cols["step"] += [k] * n
                cols["file"] += [fidx[li]] * n
                cols["offset"] += sp
                cols["length"] += ln
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
    return IoPlan(files, arr["session"], arr["step"], arr["file"], arr["offset"], arr["length"], steps,
                  int(sessions), int(block), distinct, trace.source)


def _check_rows(rows: np.ndarray, tables: Sequence[TableExtent]) -> None:
    for li, t in enumerate(tables):
        bad = np.argwhere(rows[:, li, :] >= t.rows)
        if bad.size:
            step, col = (int(x) for x in bad[0])
            raise RowRangeError(f"row id {int(rows[step, li, col])} at step {step}, layer {t.layer_id}, column "
                                f"{col} is outside the table of {t.rows} rows ({t.path})")
