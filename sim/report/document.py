"""The report document: headings, paragraphs, lists, tables, figures and code, rendered as Markdown and HTML.

One list of blocks, two renderings (:meth:`Doc.markdown`, :meth:`Doc.html`),
so the two never disagree.  Inline text uses Markdown's ``**bold**`` and
`` `code` `` only.
"""

from __future__ import annotations

import html
from typing import Any, List, Optional, Sequence

import numpy as np

__all__ = ["Doc", "anchor"]


class Doc:
    """A report as a list of blocks (headings, paragraphs, lists, tables, figures, code).

    :meth:`markdown` and :meth:`html` render the same blocks; inline text uses
    Markdown's ``**bold**`` and `` `code` `` only.
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
                out.append("| " + " | ".join(b[1]) + " |")
                out.append("|" + "---|" * len(b[1]))
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in b[2]]
                out.append("")
            elif kind == "fig":
                out.append(f"![{b[2]}]({b[1]})")
                out.append("")
                out.append(f"*{b[2]}*" + (f" Data: [`{b[3]}`]({b[3]})." if b[3] else ""))
                out.append("")
            elif kind == "code":
                out += ["```", b[1].rstrip("\n"), "```", ""]
        return "\n".join(out)

    def html(self) -> str:
        def inline(t: str) -> str:
            t = html.escape(t, quote=False)
            parts = t.split("`")
            t = "".join(f"<code>{x}</code>" if i % 2 else x for i, x in enumerate(parts))
            parts = t.split("**")
            return "".join(f"<b>{x}</b>" if i % 2 else x for i, x in enumerate(parts))

        out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(self.title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
               "table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.2em}"
               "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}th{background:#eee}"
               "img{max-width:100%;border:1px solid #ddd}figcaption{font-style:italic;font-size:0.9em}"
               "pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;font-size:0.85em}"
               "code{background:#f3f3f3}</style></head><body>", f"<h1>{html.escape(self.title)}</h1>"]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                lvl = min(b[1] + 1, 6)
                out.append(f"<h{lvl} id='{anchor(b[2])}'>{inline(b[2])}</h{lvl}>")
            elif kind == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b[1]) + "</ul>")
            elif kind == "table":
                out.append("<table><tr>" + "".join(f"<th>{inline(h)}</th>" for h in b[1]) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b[2]]
                out.append("</table>")
            elif kind == "fig":
                data = f" Data: <a href='{html.escape(b[3])}'>{html.escape(b[3])}</a>." if b[3] else ""
                out.append(f"<figure><img src='{html.escape(b[1])}' alt='{html.escape(b[2])}'>"
                           f"<figcaption>{inline(b[2])}{data}</figcaption></figure>")
            elif kind == "code":
                out.append(f"<pre>{html.escape(b[1])}</pre>")
        out.append("</body></html>")
        return "\n".join(out)


def anchor(text: str) -> str:
    """The HTML id of a heading: lower case, every other character a dash."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _cell(v: Any) -> str:
    if isinstance(v, float):
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
