"""Drawing: matplotlib on the Agg backend with the report's style, and the folder figures are saved to.

The one module of ``sim`` that imports matplotlib (inside functions: it is
an optional, heavy package).  :meth:`ReportFolder.save` refuses a figure a
reader could not read (an axes without labels, or several labelled series
and no legend), starts every linear tokens/s axis at zero (so that a
difference of a few percent is not drawn as a large one), and writes the PNG
with a 256-colour palette (a third of the size, so a self-contained page
stays small).
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path
from typing import Any, List, Sequence, Tuple

import numpy as np

from sim.core.io import atomic_output, output_error
from .document import Doc

__all__ = ["ReportFolder", "cache_axis", "colors", "plain_log_ticks", "pyplot", "spread_labels", "zero_based"]


_STYLE_SET = False


def pyplot():
    """matplotlib.pyplot on the Agg backend, with the report's style."""
    global _STYLE_SET
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    if not _STYLE_SET:
        plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
                             "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8,
                             "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12,
                             "axes.spines.top": False, "axes.spines.right": False})
        _STYLE_SET = True
    return plt


def plain_log_ticks(ax) -> None:
    """Plain numbers (1, 2, 4, ..., 1,024; 200, 300) on log axes instead of powers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log" or isinstance(axis.get_major_locator(), FixedLocator):
            continue  # linear, or ticks placed and labelled by hand
        base = getattr(axis.get_transform(), "base", 10)
        if base == 2:
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        else:
            axis.set_major_formatter(_plain(base))
            axis.set_minor_formatter(_plain(base))


def _plain(base: float):
    """A log-axis tick formatter labelling the ticks matplotlib's ``LogFormatter`` labels (its choice of which) as
    plain numbers (0.6, 200) instead of powers."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:,.6g}" if super().__call__(x, pos) else ""

    return PlainLogFormatter(base=base, labelOnlyBase=False)


def cache_axis(ax, sizes: Sequence[int]) -> List[float]:
    """A log-2 cache-size axis whose leftmost tick, "none", stands for no cache; returns the x positions."""
    nz = [c for c in sizes if c > 0]
    none_at = (min(nz) / 4) if nz else 1.0
    xs = [none_at if c == 0 else float(c) for c in sizes]
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, ["none" if c == 0 else f"{c:,}" for c in sizes])
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    return xs


def zero_based(ax) -> None:
    """Start a linear y axis at zero when its data are all positive (a tokens/s axis: see the module)."""
    if ax.get_yscale() != "linear":
        return
    lo, hi = ax.get_ylim()
    if lo > 0:
        ax.set_ylim(0, hi)


def spread_labels(ax, items: Sequence[Tuple[float, float, str, Any]], gap_px: float = 13.0) -> None:
    """Label points ``(x, y, text, colour)`` of ``ax`` without two labels overlapping.

    Labels sit to the right of their point; labels whose points are close
    (within 80 pixels across) are pushed apart vertically by ``gap_px`` pixels,
    with a thin leader line to a label that moved.  They are placed by
    :meth:`ReportFolder.save` once the figure's layout is final, so that the
    distances are the ones drawn.
    """
    pending = getattr(ax, "_engram_labels", [])
    pending.extend((float(x), float(y), str(t), c, gap_px) for x, y, t, c in items)
    ax._engram_labels = pending


def _place_labels(ax) -> None:
    """Draw the labels :func:`spread_labels` recorded on ``ax`` (its layout is final)."""
    items = getattr(ax, "_engram_labels", None)
    if not items:
        return
    ax._engram_labels = []
    trans = ax.transData
    pts = sorted(((trans.transform((x, y)), x, y, text, color, gap) for x, y, text, color, gap in items),
                 key=lambda p: (p[0][1], p[0][0]))
    placed: List[Tuple[float, float]] = []  # (display x, display y of the label)
    dpi = ax.figure.dpi
    for (dx, dy), x, y, text, color, gap in pts:
        ly = dy
        for px, py in placed:
            if abs(px - dx) < 80 and ly < py + gap:
                ly = py + gap
        placed.append((dx, ly))
        shift = (ly - dy) * 72.0 / dpi
        ax.annotate(text, (x, y), xytext=(7, 4 + shift), textcoords="offset points", fontsize=8, color=color,
                    va="bottom", arrowprops=dict(arrowstyle="-", lw=0.5, color=color) if shift > 1 else None)


def _write_png(fig, path: Path) -> None:
    """The figure as a palette PNG (256 colours, optimised), atomically."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.15)
    buf.seek(0)
    img = Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                                  dither=Image.Dither.NONE)
    with atomic_output(path) as tmp:
        img.save(tmp, format="PNG", optimize=True)


class ReportFolder:
    """The report folder: ``figures/`` (PNG), ``data/`` (the numbers of each figure, CSV) and ``inputs/``.

    Raises
    ------
    OutputError
        The folder cannot be made (names the path and the reason).
    """

    def __init__(self, root: Path):
        self.root = root
        for sub in ("figures", "data", "inputs"):
            try:
                (root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise output_error(root / sub, exc, "make the report folder") from None
        self.figures: List[Tuple[str, str, str]] = []  # (figure, data, title)

    def save(self, fig, name: str, title: str) -> str:
        """Save ``fig`` as ``figures/NAME.png`` with ``title``; every visible axes must be readable.

        Raises
        ------
        RuntimeError
            An axes without x or y label, or with several labelled lines but no legend.
        OutputError
            The file cannot be written.
        """
        for ax in fig.axes:
            plain_log_ticks(ax)
            if not ax.get_visible():
                continue
            if "tokens/s" in ax.get_ylabel():
                zero_based(ax)
            if not ax.get_xlabel() or not ax.get_ylabel():
                raise RuntimeError(f"figure {name}: an axes lacks an axis label")
            labelled = [h for h in ax.get_legend_handles_labels()[1] if not h.startswith("_")]
            if len(labelled) > 1 and ax.get_legend() is None and not fig.legends:
                raise RuntimeError(f"figure {name}: an axes with {len(labelled)} labelled series has no legend")
        fig.suptitle(title, fontweight="bold")
        fig.tight_layout()
        for ax in fig.axes:
            _place_labels(ax)
        rel = f"figures/{name}.png"
        try:
            _write_png(fig, self.root / rel)
        finally:
            pyplot().close(fig)
        return rel

    def csv(self, name: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        """Write ``data/NAME.csv`` (floats at full precision); return its path relative to the folder."""
        rel = f"data/{name}.csv"
        try:
            with open(self.root / rel, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(header)
                for r in rows:
                    w.writerow([repr(float(v)) if isinstance(v, (float, np.floating)) else v for v in r])
        except OSError as exc:
            raise output_error(self.root / rel, exc) from None
        return rel

    def copy_inputs(self, paths: Sequence[Path], name: str = "") -> None:
        """Copy the files of ``paths`` that exist into ``inputs/`` (under ``name`` when given, else their own).

        Raises
        ------
        OutputError
            A file cannot be written (names the path).
        """
        for src in paths:
            if src.is_file():
                dst = self.root / "inputs" / (name or src.name)
                try:
                    shutil.copyfile(src, dst)
                except OSError as exc:
                    raise output_error(dst, exc) from None

    def add(self, doc: Doc, fig_rel: str, data_rel: str, caption: str) -> None:
        """Put a saved figure and its data into ``doc`` with ``caption``."""
        self.figures.append((fig_rel, data_rel, caption))
        doc.figure(fig_rel, caption, data_rel)


def colors() -> List[str]:
    """The colours of the style's cycle, in order."""
    return pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
