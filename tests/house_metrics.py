"""The house's size targets (issue 25), measured with :mod:`ast` over ``engram/`` and ``sim/``.

Run ``.venv/bin/python -m tests.house_metrics`` (the working tree) or ``... --rev main`` (a git
revision, read with ``git show``; nothing is checked out); ``--json`` for a script.  A report,
not a test: it prints the figures and their targets and always exits 0 (2 on bad arguments).

Figures (targets of issue 25 in brackets):

- top-level units of ``sim/``: its modules and packages, as ARCHITECTURE.md counts them (<= 12);
- lines of ``sim/`` (``.py`` files, every line) (<= 20,000);
- functions longer than 80 lines, from ``def`` to the last line of the body (<= 6);
- functions with 10 or more parameters, ``self``/``cls`` not counted (<= 4);
- hand-written ``add_argument`` calls (<= 120);
- shim modules (0): a module that defines or makes a module ``__getattr__`` (old names kept alive),
  or whose body is nothing but a docstring, imports and ``__all__`` (a package's ``__init__.py`` is a
  map, not a shim).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engram", "sim")
LONG_LINES = 80
MANY_PARAMS = 10
TARGETS = {"sim_units": 12, "sim_lines": 20_000, "long_functions": 6, "many_parameters": 4,
           "add_argument": 120, "shims": 0}


@dataclass
class Metrics:
    """The figures of one tree (see the module docstring); lists name ``path:line name (n)``."""

    source: str
    sim_units: int = 0
    sim_lines: int = 0
    engram_lines: int = 0
    long_functions: List[str] = field(default_factory=list)
    many_parameters: List[str] = field(default_factory=list)
    add_argument: int = 0
    add_argument_by_package: Dict[str, int] = field(default_factory=dict)
    shims: List[str] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        return {"sim_units": self.sim_units, "sim_lines": self.sim_lines, "long_functions": len(self.long_functions),
                "many_parameters": len(self.many_parameters), "add_argument": self.add_argument,
                "shims": len(self.shims)}


def _files_here() -> Dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            out[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8")
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def _files_at(rev: str) -> Dict[str, str]:
    names = _git("ls-tree", "-r", "--name-only", rev, "--", *PACKAGES).split()
    return {n: _git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def _parameters(fn: ast.AST) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names)


def _module_getattr(fn: ast.AST) -> bool:
    """``fn`` is, or makes, a module ``__getattr__`` (a function of that name, at any depth)."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__getattr__"
               for n in ast.walk(fn))


def _is_shim(path: str, tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _module_getattr(node):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__getattr__"
                                                for t in node.targets):
            return True
    if path.endswith("__init__.py"):
        return False
    body = [n for n in tree.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))]
    if not body:
        return False
    for n in body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
        return False
    return any(isinstance(n, ast.ImportFrom) for n in body)


def _units(paths: Iterable[str]) -> int:
    """Modules and packages directly under sim/ (``sim/data`` holds no code and does not count)."""
    top = set()
    for p in paths:
        parts = p.split("/")
        if parts[0] != "sim" or len(parts) < 2:
            continue
        if len(parts) == 2:
            if parts[1] != "__init__.py":
                top.add(parts[1][:-3])
        elif f"sim/{parts[1]}/__init__.py" in paths:
            top.add(parts[1])
    return len(top)


def measure(files: Dict[str, str], source: str) -> Metrics:
    """The figures of ``files`` (path -> text, paths relative to the repository root)."""
    m = Metrics(source)
    m.sim_units = _units(files)
    for path, text in sorted(files.items()):
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        pkg = path.split("/")[0]
        if pkg == "sim":
            m.sim_lines += lines
        else:
            m.engram_lines += lines
        tree = ast.parse(text, filename=path)
        if _is_shim(path, tree):
            m.shims.append(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG_LINES:
                    m.long_functions.append(f"{path}:{node.lineno} {node.name} ({n} lines)")
                k = _parameters(node)
                if k >= MANY_PARAMS:
                    m.many_parameters.append(f"{path}:{node.lineno} {node.name} ({k} parameters)")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "add_argument":
                m.add_argument += 1
                m.add_argument_by_package[pkg] = m.add_argument_by_package.get(pkg, 0) + 1
    return m


def _print(m: Metrics) -> None:
    c = m.counts()
    print(f"{m.source}")
    print(f"  sim/ top-level units     {c['sim_units']:>6}   (target <= {TARGETS['sim_units']})")
    print(f"  sim/ lines               {c['sim_lines']:>6}   (target <= {TARGETS['sim_lines']:,}; engram/: "
          f"{m.engram_lines})")
    print(f"  functions > {LONG_LINES} lines      {c['long_functions']:>6}   (target <= {TARGETS['long_functions']})")
    for s in m.long_functions:
        print(f"    {s}")
    print(f"  functions >= {MANY_PARAMS} params   {c['many_parameters']:>6}   (target <= {TARGETS['many_parameters']})")
    for s in m.many_parameters:
        print(f"    {s}")
    by = ", ".join(f"{k}/ {v}" for k, v in sorted(m.add_argument_by_package.items()))
    print(f"  add_argument calls       {c['add_argument']:>6}   (target <= {TARGETS['add_argument']}; {by})")
    print(f"  shim modules             {c['shims']:>6}   (target {TARGETS['shims']})")
    for s in m.shims:
        print(f"    {s}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.house_metrics", description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", action="append", default=[], metavar="REV",
                   help="measure git revision REV instead of the working tree (repeatable: one report each; "
                        "'.' is the working tree)")
    p.add_argument("--json", action="store_true", help="print one JSON object per tree, one a line")
    args = p.parse_args(argv)
    out: List[Metrics] = []
    for rev in args.rev or ["."]:
        if rev == ".":
            out.append(measure(_files_here(), "working tree"))
            continue
        try:
            files = _files_at(rev)
        except subprocess.CalledProcessError as exc:
            print(f"house_metrics: git cannot read revision {rev!r}: {exc.stderr.strip()}", file=sys.stderr)
            return 2
        out.append(measure(files, f"git {rev}"))
    for m in out:
        if args.json:
            print(json.dumps({**asdict(m), "counts": m.counts(), "targets": TARGETS}))
        else:
            _print(m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
