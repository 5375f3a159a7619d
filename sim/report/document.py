"""The report document: headings, paragraphs, lists, tables, figures and code, as Markdown and as HTML.

One list of blocks and one rendering: :meth:`Doc.markdown` writes CommonMark
(with tables), and :meth:`Doc.html` renders that same Markdown with
markdown-it-py, so the two never disagree and no Markdown syntax is left raw
in the page.  Inline text uses Markdown (``**bold**``, `` `code` ``,
``[links](#anchor)``); raw HTML in the text is shown as text, never
interpreted.

The HTML page is self-contained by default: figures are embedded as
``data:`` URIs, links to the figures go to the embedded figure, and links to
the data files carry the file itself (``data:text/csv``, downloaded under its
name), so ``report.html`` can be sent on alone.  Heading ids are
:func:`anchor` of the heading, as the Markdown contents links expect.
"""

from __future__ import annotations

import base64
import html
import mimetypes
from pathlib import Path
from typing import Any, List, Optional, Sequence

import numpy as np
from markdown_it import MarkdownIt

__all__ = ["Doc", "anchor", "render_html"]

_CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
        "table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.2em}"
        "td,th{border:1px solid #bbb;padding:2px 6px;text-align:left;vertical-align:top}th{background:#eee}"
        "img{max-width:100%;border:1px solid #ddd}p.caption{font-style:italic;font-size:0.9em}"
        "pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;font-size:0.85em}"
        "code{background:#f3f3f3}")


class Doc:
    """A report as a list of blocks (headings, paragraphs, lists, tables, figures, code).

    :meth:`markdown` renders them as Markdown; :meth:`html` renders that Markdown as one HTML page.
    """

    def __init__(self, title: str):
        self.title = title
        self.blocks: List[tuple] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(("table", [str(h) for h in header], [[_cell(c) for c in r] for r in rows]))

    def figure(self, path: str, caption: str, data: Optional[str] = None) -> None:
        self.blocks.append(("fig", path, caption, data))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    # ------------------------------------------------------------ rendering
    def markdown(self) -> str:
        """The document as CommonMark with tables (the figures and data linked by relative path)."""
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out += ["#" * (b[1] + 1) + " " + b[2], ""]
            elif kind == "p":
                out += [b[1], ""]
            elif kind == "ul":
                out += [f"- {x}" for x in b[1]] + [""]
            elif kind == "table":
                out.append("| " + " | ".join(_table_cell(h) for h in b[1]) + " |")
                out.append("|" + "".join("---:|" if _numeric([r[j] for r in b[2] if j < len(r)]) else "---|"
                                         for j in range(len(b[1]))))
                out += ["| " + " | ".join(_table_cell(c) for c in r) + " |" for r in b[2]]
                out.append("")
            elif kind == "fig":
                alt = b[2].replace("[", "(").replace("]", ")")
                out.append(f"![{alt}]({b[1]})")
                out.append("")
                out.append(f"*{b[2]}*" + (f" Data: [`{b[3]}`]({b[3]})." if b[3] else ""))
                out.append("")
            elif kind == "code":
                out += ["```", b[1].rstrip("\n"), "```", ""]
        return "\n".join(out)

    def html(self, root: Optional[Path] = None, self_contained: bool = True) -> str:
        """The document as one HTML page (see the module docstring).

        ``root`` is the folder the relative paths start from; with
        ``self_contained`` (and a ``root``) figures and data files are embedded.

        Raises
        ------
        FileNotFoundError
            A figure or data file to embed is missing.
        """
        return render_html(self.markdown(), self.title, root=root, self_contained=self_contained)


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "typographer": False, "xhtmlOut": False}).enable("table")


def _local(target: str) -> bool:
    return bool(target) and not target.startswith(("#", "data:", "http:", "https:", "mailto:", "/"))


def _data_uri(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path.suffix == ".csv":
        mime = "text/csv"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure_id(target: str) -> str:
    return "figure-" + anchor(Path(target).stem)


def render_html(markdown: str, title: str, *, root: Optional[Path] = None, self_contained: bool = True) -> str:
    """Render report Markdown as one HTML page: heading ids by :func:`anchor`, tables, and, when
    ``self_contained`` with a ``root``, every local figure and linked file embedded.

    Raises
    ------
    FileNotFoundError
        A figure or data file to embed is missing.
    """
    md = _parser()
    tokens = md.parse(markdown)
    embed = self_contained and root is not None
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            tok.attrSet("id", anchor(tokens[i + 1].content))
        for child in tok.children or ():
            if child.type == "image":
                src = str(child.attrGet("src") or "")
                if _local(src):
                    child.attrSet("id", _figure_id(src))
                    if embed:
                        child.attrSet("src", _data_uri(root / src))
            elif child.type == "link_open":
                href = str(child.attrGet("href") or "")
                if not (embed and _local(href)):
                    continue
                if href.startswith("figures/") and href.endswith(".png"):
                    child.attrSet("href", "#" + _figure_id(href))
                else:
                    child.attrSet("href", _data_uri(root / href))
                    child.attrSet("download", Path(href).name)
    body = md.renderer.render(tokens, md.options, {})
    # a figure's caption: the paragraph right after it, in italics
    body = body.replace("<p><em>", "<p class=\"caption\"><em>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style></head><body>\n{body}</body></html>\n")


def anchor(text: str) -> str:
    """The HTML id of a heading: lower case, every other character a dash, no dash at either end."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _numeric(cells: Sequence[str]) -> bool:
    """A column of numbers (``1,234``, ``-5.2%``, ``>= 64``, ``-``): aligned right."""
    seen = False
    for c in cells:
        t = c.replace(",", "").replace("%", "").replace(">= ", "").strip()
        if t in ("-", ""):
            continue
        try:
            float(t)
        except ValueError:
            return False
        seen = True
    return seen


def _table_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cell(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if not np.isfinite(v):
            return "-"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return "-" if v is None else str(v)
