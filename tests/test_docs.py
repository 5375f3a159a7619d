"""The documentation checked against the code and against itself.

- docs/cli.md is the page :mod:`tests.cli_reference` generates from the argparse parsers today
  (``python -m tests.cli_reference`` rewrites it);
- every relative link of README.md and docs/*.md names a file that exists, and a ``#fragment`` into a
  Markdown page names one of its headings (GitHub's heading anchors);
- README.md is a front page: at most 200 lines, every docs page linked from it, and no table cell in it
  or in docs/ longer than 120 characters.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

from tests.cli_reference import CLI_PAGE, REGENERATE, _section, render

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README] + sorted(DOCS.glob("*.md"))

#: Longest table cell allowed (characters between two pipes).
MAX_CELL = 120
#: Longest front page (lines).
MAX_README_LINES = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> List[str]:
    """The lines of a Markdown page outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> Set[str]:
    """Every heading anchor of a page (a repeated heading gets ``-1``, ``-2`` ... as on GitHub)."""
    seen: Dict[str, int] = {}
    out = set()
    for line in prose_lines(text):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> List[str]:
    """The targets of the page's Markdown links outside code (blocks and spans)."""
    out = []
    for line in prose_lines(text):
        out += _LINK.findall(_CODE_SPAN.sub("", line))
    return out


def broken_links(page: Path) -> List[str]:
    """The relative links of ``page`` that name no file, or no heading of the Markdown page they name."""
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{page.name}: {target} (no heading #{fragment} in {dest.name})")
    return bad


def long_cells(text: str) -> List[str]:
    """Table cells longer than :data:`MAX_CELL` characters (``\\|`` inside a cell is part of it)."""
    out = []
    for line in prose_lines(text):
        if not line.startswith("|"):
            continue
        for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]:
            if len(cell.strip()) > MAX_CELL:
                out.append(cell.strip()[:60] + "...")
    return out


# ------------------------------------------------------------------------ tests
def test_cli_reference_is_current():
    assert CLI_PAGE.exists(), f"docs/cli.md is missing: run {REGENERATE}"
    assert CLI_PAGE.read_text(encoding="utf-8") == render(), \
        f"docs/cli.md is out of date with the parsers: run {REGENERATE}"


def test_cli_reference_has_every_command_and_its_options():
    page = render()
    for command in ("engram info", "engram synth", "engram lookup", "engram measure", "engram calibrate",
                    "engram crosscheck", "engram report", "engram demo", "engram sim decode",
                    "engram sim trace synth", "engram sim capacity", "engram sim serve"):
        assert f"\n## {command}\n" in page or f"\n### {command}\n" in page or f"\n#### {command}\n" in page, command
    # plugin commands are complete, not the stubs the top-level parser lists
    assert "from the sim package" not in page
    assert "- `--rate RATE`" in page and "- `--compute-scale COMPUTE_SCALE`" in page


def test_cli_section_of_a_known_parser():
    top = argparse.ArgumentParser(prog="engram")
    sub = top.add_subparsers(dest="command")
    p = sub.add_parser("try", help="one line", description="What it does, with a * and <x>.")
    p.add_argument("path", help="a file")
    p.add_argument("--depth", type=int, default=16, help="queue depth (default %(default)s)")
    g = p.add_argument_group("policy", "how rows are read")
    g.add_argument("--backend", choices=["pread", "io_uring"], help="read backend")
    got = _section(p, "one line", {})
    usage = got[got.index("```text") + 1]
    assert usage.startswith("usage: engram try [-h] [--depth DEPTH]") and "path" in usage
    assert got[:4] == ["## engram try", "", "What it does, with a \\* and &lt;x&gt;.", ""]
    body = "\n".join(got[got.index("```", got.index("```text") + 1) + 1:])
    assert body.strip() == "\n".join([
        "Positional arguments:", "", "- `path`: a file", "",
        "Options:", "", "- `-h, --help`: show this help message and exit",
        "- `--depth DEPTH`: queue depth (default 16)", "",
        "Policy:", "", "how rows are read", "", "- `--backend {pread,io_uring}`: read backend"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_link_check_finds_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The main job: `make demo`\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#the-main-job-make-demo) [gone](missing.md) [anchor](other.md#nope)\n"
                    "[web](https://example.org/x) `[code](missing2.md)`\n"
                    "```\n[fenced](missing3.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#nope (no heading #nope in other.md)"]


def test_anchors_follow_github():
    text = "# engram\n## Two commands\n## Two commands\n```\n# not a heading\n```\n### `engram sim` (what-if)\n"
    assert anchors(text) == {"engram", "two-commands", "two-commands-1", "engram-sim-what-if"}


def test_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(text)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"README.md links no docs page named {unlinked}"
    assert "make test" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_table_cells_are_short(page):
    assert long_cells(page.read_text(encoding="utf-8")) == []


def test_long_cell_check_finds_a_long_cell():
    assert long_cells("| a | b |\n|---|---|\n| x | " + "y" * 121 + " |\n") == ["y" * 60 + "..."]
    assert long_cells("| a \\| b | " + "y" * 120 + " |\n") == []
