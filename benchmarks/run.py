"""Run benchmarks: ``python -m benchmarks.run [NAME ...]``.

Each ``benchmarks/bench_NAME.py`` defines ``main(argv) -> dict``: it measures the
engine side by side with its peer or limit in one run, prints a short table and
returns the record that is saved to ``benchmarks/results/NAME.json``.
With no NAME every benchmark runs.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

from .common import save


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(available())}")
    args, rest = p.parse_known_args(argv)
    names = args.names or available()
    for name in names:
        if name not in available():
            p.error(f"unknown benchmark {name!r}; known: {', '.join(available())}")
        mod = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"== {name}")
        record = mod.main(rest)
        print(f"   saved {save(name, record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
