"""docs/cli.md, the command-line reference, generated from the argparse parsers.

The ``engram`` parser is built with :func:`engram.cli.build_parser` once per command, so that every
plugin command (``sim``, ``measure``, ``calibrate``, ``crosscheck``, ``report``, ``demo``: the
``engram.commands`` entry points of ``setup.cfg``) is loaded with its options, and every command and
subcommand is walked: its usage, description, subcommands and options (by argument group), each option's
help as ``--help`` prints it.  Nothing is written by hand, so a new flag needs no edit here.

``python -m tests.cli_reference`` rewrites docs/cli.md; ``tests/test_docs.py`` checks it is current.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import List, Optional, Tuple

from engram.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "cli.md"
REGENERATE = ".venv/bin/python -m tests.cli_reference"

#: Line width of the usage blocks (fixed, so the page does not depend on the terminal it was made on).
WIDTH = 100


def _subparsers(parser: argparse.ArgumentParser) -> Optional[argparse._SubParsersAction]:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    try:
        return parser.formatter_class(prog=parser.prog, width=WIDTH)
    except TypeError:  # a formatter class that takes no width
        return parser._get_formatter()


def _helps(action: argparse._SubParsersAction) -> dict:
    """Subcommand name -> its one-line help in the parent's listing."""
    return {a.dest: a.help or "" for a in action._choices_actions}


def commands() -> List[Tuple[argparse.ArgumentParser, str, dict]]:
    """(parser, one-line help, its subcommands' one-line helps) of ``engram`` and of every command and
    subcommand under it, depth first.

    A plugin command is taken from a parser built for a command line that runs it, so it is complete (and
    the top level lists it with its own help, not the stub's).
    """
    top = build_parser([])
    top_helps = _helps(_subparsers(top))
    out = [(top, "", top_helps)]
    for name in list(_subparsers(top).choices):
        sub = _subparsers(build_parser([name]))
        top_helps[name] = _helps(sub).get(name, "")
        out += _walk(sub.choices[name], top_helps[name])
    return out


def _walk(parser: argparse.ArgumentParser, help_line: str) -> List[Tuple[argparse.ArgumentParser, str, dict]]:
    sub = _subparsers(parser)
    helps = _helps(sub) if sub is not None else {}
    out = [(parser, help_line, helps)]
    if sub is not None:
        for name, child in sub.choices.items():
            out += _walk(child, helps.get(name, ""))
    return out


def _text(s: str) -> str:
    """Help text as Markdown: whitespace collapsed, characters Markdown would read as markup escaped."""
    s = " ".join(s.split())
    s = s.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
    return s


def _title(title: Optional[str]) -> str:
    """An argument group's title, the same on every Python (before 3.10 argparse says "optional arguments")."""
    if not title or title in ("options", "optional arguments"):
        return "Options"
    return title[0].upper() + title[1:]


def _anchor(prog: str) -> str:
    """The heading anchor GitHub gives ``prog`` (lower case, spaces to hyphens)."""
    return re.sub(r"[^a-z0-9 _-]", "", prog.lower()).replace(" ", "-")


def _section(parser: argparse.ArgumentParser, help_line: str, sub_helps: dict) -> List[str]:
    fmt = _formatter(parser)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    usage = fmt.format_help().strip()
    level = "#" * (2 + max(0, parser.prog.count(" ") - 1))
    out = [f"{level} {parser.prog}", ""]
    about = parser.description or help_line
    if about:
        out += [_text(about), ""]
    out += ["```text", usage, "```", ""]
    if sub_helps:
        out += ["Subcommands:", ""]
        for name, h in sub_helps.items():
            out.append(f"- [`{parser.prog} {name}`](#{_anchor(parser.prog + ' ' + name)}): {_text(h)}")
        out.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        out += [f"{_title(group.title)}:", ""]
        if group.description:
            out += [_text(group.description), ""]
        for a in actions:
            invocation = fmt._format_action_invocation(a)
            h = fmt._expand_help(a) if a.help else ""
            out.append(f"- `{invocation}`" + (f": {_text(h)}" if h else ""))
        out.append("")
    return out


def render() -> str:
    """The whole of docs/cli.md."""
    out = ["# Command-line reference", "",
           "<!-- Generated from the argparse parsers by tests/cli_reference.py: do not edit by hand. "
           f"Regenerate with `{REGENERATE}`. -->", "",
           "Every command prints the same with `--help`; commands a script would read take `--json`.",
           "The simulator's commands (`sim`, `measure`, `calibrate`, `crosscheck`, `report`, `demo`) come "
           "from the `sim` package through the `engram.commands` entry points.", ""]
    for parser, help_line, sub_helps in commands():
        out += _section(parser, help_line, sub_helps)
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    CLI_PAGE.parent.mkdir(exist_ok=True)
    CLI_PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {CLI_PAGE.relative_to(ROOT)}")
