"""The house rules of ARCHITECTURE.md, checked on the real code.

- ``engram`` never imports ``sim``, ``simpy`` or ``matplotlib``: not in its
  source (any import, even inside a function), and not at run time (a fresh
  interpreter imports ``engram`` and ``engram.cli`` and runs ``engram --help``
  and ``engram info``);
- no import cycle among the project's modules (``engram`` and ``sim``), with
  the imports inside functions counted;
- imports between the project's modules sit at module level;
- the layer diagram in ARCHITECTURE.md is the one the imports give, and the
  page names every module of ``sim``.

The graph is built with :mod:`ast` from the source files, so it sees every
import statement whether or not it runs.  ``python -m tests.test_architecture``
rewrites the diagram in ARCHITECTURE.md from the imports.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Set

import pytest

import engram.cli
from engram.cli import plugin_commands

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engram", "sim")
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
BEGIN, END = "<!-- imports: begin -->", "<!-- imports: end -->"

class Import(NamedTuple):
    source: str     # importing module
    target: str     # imported module (the nearest project module, or the top-level name of another package)
    line: int
    in_function: bool


def modules(root: Path = ROOT) -> Dict[str, Path]:
    """Module name -> source file of every module of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool, known: Set[str]) -> List[str]:
    """The modules an import statement names (``from p import m`` names ``p.m`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    if node.level:
        pkg = base + ("." + node.module if node.module else "")
    else:
        pkg = node.module or ""
    return [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in known else pkg for a in node.names]


def imports(root: Path = ROOT) -> List[Import]:
    """Every import statement of the project's modules, at module level or inside a function."""
    mods = modules(root)
    known = set(mods)
    out: List[Import] = []

    def visit(node: ast.AST, module: str, is_package: bool, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(child, module, is_package, known):
                    nearest = t
                    while nearest and nearest not in known:
                        nearest = nearest.rpartition(".")[0]
                    out.append(Import(module, nearest or t.split(".")[0], child.lineno, in_function))
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, module, is_package, inner)

    for module, path in mods.items():
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), module, path.name == "__init__.py", False)
    return out


def _own(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    """Module -> the project's modules it imports (module and function level)."""
    g: Dict[str, Set[str]] = {m: set() for m in modules(root)}
    for imp in imports(root):
        if _own(imp.target) and imp.target != imp.source:
            g[imp.source].add(imp.target)
    return g


def cycles(g: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            connect(v)
    return found


def _unit(module: str) -> str:
    """The unit of the diagram a module belongs to: ``engram`` as a whole, a top-level module or package of sim."""
    parts = module.split(".")
    return "engram" if parts[0] == "engram" else ".".join(parts[:2])


def diagram(root: Path = ROOT) -> str:
    """The layers of ``sim`` from its imports: each unit (a module, or a package as a whole) one layer above
    the highest unit it imports, with what it imports."""
    deps: Dict[str, Set[str]] = {}
    for src, targets in graph(root).items():
        u = _unit(src)
        deps.setdefault(u, set())
        deps[u] |= {_unit(t) for t in targets if _unit(t) != u}
    layer: Dict[str, int] = {}

    def depth(u: str) -> int:
        if u not in layer:
            layer[u] = 1 + max((depth(d) for d in deps[u]), default=-1)
        return layer[u]

    width = max(len(u) for u in deps)
    lines = []
    for u in sorted(deps, key=lambda u: (depth(u), u)):
        used = ", ".join(sorted(deps[u], key=lambda d: (layer[d], d))) or "-"
        lines.append(f"layer {layer[u]:>2}  {u:<{width}}  imports {used}")
    return "\n".join(lines)


def _block(text: str) -> str:
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip().strip("`").strip()


def layout_paths(text: str) -> Set[str]:
    """The paths the page's Layout tree names: ``sim/device/latency.py``, ``sim/device/`` ...

    Each line of the tree is ``NAMES  description``, NAMES one or more comma-separated file or folder
    names (a folder ends with ``/``); indentation nests a line under the folder above it.
    """
    tree = text[text.index("## Layout"):]
    tree = tree[tree.index("```") + 3:]
    tree = tree[:tree.index("```")]
    out: Set[str] = set()
    folders: List[tuple] = []  # (indent, folder path)
    for line in tree.strip("\n").splitlines():
        indent = len(line) - len(line.lstrip(" "))
        names = line.strip().split("  ")[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = folders[-1][1] if folders else ""
        for name in (n.strip() for n in names.split(",")):
            out.add(prefix + name)
            if name.endswith("/"):
                folders.append((indent, prefix + name))
    return out


# ------------------------------------------------------------------------ tests
def test_engine_source_never_imports_the_simulator():
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in imports()
           if i.source.split(".")[0] == "engram" and i.target.split(".")[0] in ("sim", "simpy", "matplotlib")]
    assert not bad, bad


def test_engine_never_loads_the_simulator():
    code = ("import contextlib, io, json, sys\n"
            "import engram, engram.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        engram.cli.main(['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "    rc = engram.cli.main(['info'])\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules\n"
            "                         if m.split('.')[0] in ('sim', 'simpy', 'matplotlib'))]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    rc, loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert rc == 0 and loaded == [], loaded


def test_simulator_commands_are_plugins():
    eps = plugin_commands()
    assert {"sim", "measure", "calibrate", "crosscheck", "report", "demo"} <= set(eps)
    assert all(ep.module == "sim.cli" for name, ep in eps.items() if name in ("sim", "report", "demo"))


def test_a_broken_plugin_breaks_only_its_command(monkeypatch, capsys):
    broken = importlib.metadata.EntryPoint("broken", "no_such_package_xyz.cli:add", "engram.commands")
    monkeypatch.setattr(engram.cli, "plugin_commands", lambda: {"broken": broken})
    with pytest.raises(SystemExit):
        engram.cli.main(["--help"])
    assert "broken" in capsys.readouterr().out
    assert engram.cli.main(["info", "--json"]) == 0
    capsys.readouterr()
    assert engram.cli.main(["broken", "--any", "args"]) == 2
    err = capsys.readouterr().err
    assert "could not be loaded from no_such_package_xyz.cli:add" in err and "No module named" in err


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_between_our_modules_are_at_module_level():
    inside = [f"{i.source}:{i.line} imports {i.target}" for i in imports()
              if i.in_function and _own(i.target)]
    assert not inside, inside


def test_simulator_imports_inside_functions_only_optional_heavy_packages():
    heavy = {"simpy", "matplotlib", "PIL", "dask", "pyarrow"}  # PIL: the Pillow matplotlib brings
    inside = [f"{i.source}:{i.line} imports {i.target}" for i in imports()
              if i.in_function and i.source.split(".")[0] == "sim" and i.target.split(".")[0] not in heavy]
    assert not inside, inside


def test_measuring_code_is_apart_from_the_simulator():
    g = graph()
    readers = [m for m in g if _unit(m) in ("sim.check", "sim.decode", "sim.sweep", "sim.report")]
    bad = [f"{m} imports {t}" for m in readers for t in g[m] if _unit(t) == "sim.measure"]
    assert not bad, bad


def test_architecture_page_shows_the_imports():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert _block(text) == diagram(), "ARCHITECTURE.md is out of date: run python -m tests.test_architecture"


def test_architecture_page_names_every_module():
    """Every module of both packages and every source file of the engine's kernels (a name may be a
    pattern such as ``io_*.h``); every name is a file that exists."""
    named = layout_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    files = [p.relative_to(ROOT) for p in modules().values()]
    native = ROOT / "engram" / "_native"
    files += [p.relative_to(ROOT) for p in sorted(native.iterdir()) if p.suffix in (".pyx", ".pxd", ".h")]
    wanted = {f"{p.parent}/" if p.name == "__init__.py" else str(p) for p in files}
    missing = {w for w in wanted if not any(fnmatch.fnmatchcase(w, n) for n in named)}
    assert not missing, f"ARCHITECTURE.md's layout does not name {sorted(missing)}"
    gone = {p for p in named if p.split("/")[0] in PACKAGES and not list(ROOT.glob(p))}
    assert not gone, f"ARCHITECTURE.md's layout names missing files {sorted(gone)}"


if __name__ == "__main__":
    page = ARCHITECTURE.read_text(encoding="utf-8")
    new = page[:page.index(BEGIN) + len(BEGIN)] + "\n```\n" + diagram() + "\n```\n" + page[page.index(END):]
    ARCHITECTURE.write_text(new, encoding="utf-8")
    print(diagram())
