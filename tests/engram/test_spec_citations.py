"""Every "SPEC §N" the code cites names a section of the specification that ships with the package."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITE = re.compile(r"SPEC §(\d+)")
HEADING = re.compile(r"^## (\d+)\. ", re.M)


def _sections() -> set:
    text = resources.files("engram").joinpath("SPEC.md").read_text(encoding="utf-8")
    return {int(n) for n in HEADING.findall(text)}


def test_spec_ships_with_the_package():
    assert _sections() == set(range(1, 10))


def test_every_citation_names_a_section():
    sections = _sections()
    cited = {}
    for folder in ("engram", "sim"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".pyx", ".pxd", ".h", ".c"}:
                continue
            for n in CITE.findall(path.read_text(encoding="utf-8")):
                cited.setdefault(int(n), path.relative_to(ROOT))
    assert cited, "no citation found: the pattern is wrong"
    missing = {n: str(p) for n, p in cited.items() if n not in sections}
    assert not missing, f"cited sections absent from engram/SPEC.md: {missing}"
