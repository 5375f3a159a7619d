"""The ``engram`` command.

Engine commands live here; the simulator's commands (``sim``, ``measure``,
``calibrate``, ``crosscheck``, ``report``, ``demo``) are registered by
``sim.cli.register`` when the ``sim`` package is importable, so the engine
itself never needs the simulator's dependencies.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import numpy as np

from .errors import EngramError


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# --------------------------------------------------------------------- info
def _cmd_info(args) -> int:
    from . import __version__
    from ._native import hashing

    info = {
        "version": __version__,
        "hash_simd": "avx512" if hashing._CPU_AVX512_PUBLIC() else "scalar",
    }
    try:
        from . import table  # noqa: F401

        info["read_backends"] = list(table.available_backends())
    except ImportError:
        info["read_backends"] = []
    if args.json:
        _print_json(info)
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v if not isinstance(v, list) else ', '.join(v) or '-'}")
    return 0


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="version, built kernels and read backends")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_info)


# --------------------------------------------------------------------- hash
def _read_tokens_file(path: str) -> np.ndarray:
    """Token ids from a file: whitespace/comma separated integers, or a .npy array."""
    if path.endswith(".npy"):
        return np.load(path)
    with open(path, encoding="utf-8") as f:
        text = f.read().replace(",", " ")
    try:
        return np.array([int(x) for x in text.split()], dtype=np.int64)
    except ValueError as exc:
        raise EngramError(f"{path}: token files hold integers ({exc})") from None


def _cmd_hash(args) -> int:
    from .hashing import Hasher
    from .layout import Layout
    from .tokenmap import build_token_map, load_tokenizer

    layout = Layout.deepseek_v41_flash(scale=args.scale)
    if args.text is not None:
        tok = load_tokenizer(args.tokenizer)
        ids = np.array(tok.encode(args.text, add_special_tokens=False).ids, dtype=np.int64)
    elif args.tokens is not None:
        ids = _read_tokens_file(args.tokens)
    else:
        raise EngramError("give --text or --tokens")
    if args.compressed:
        hasher = Hasher(layout)
    else:
        hasher = Hasher(layout, build_token_map(args.tokenizer))
    rows = hasher.hash(ids)
    if args.json:
        _print_json({"layer_ids": list(layout.layer_ids), "tokens": ids.tolist(), "rows": rows.tolist()})
    else:
        for t, tid in enumerate(ids.tolist()):
            for li, lid in enumerate(layout.layer_ids):
                print(f"token {t:>5} id {tid:>6} layer {lid:>2}: " + " ".join(str(r) for r in rows[t, li]))
    return 0


def _add_hash(sub) -> None:
    p = sub.add_parser("hash", help="row ids of a text or token file under the V4.1 layout")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to tokenize with the DeepSeek V4 tokenizer")
    src.add_argument("--tokens", help="file of token ids (integers, or .npy)")
    p.add_argument("--compressed", action="store_true", help="the token ids are already compressed ids")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the DeepSeek V4 one)")
    p.add_argument("--scale", type=float, default=1.0, help="bucket-size scale of the layout (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_hash)


# ---------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram",
        description="Serve and simulate the on-disk n-gram memory (Engram) of DeepSeek V4.1-class models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_info(sub)
    _add_hash(sub)
    for name in ("inspect", "synth", "lookup"):
        adder = globals().get(f"_add_{name}")
        if adder is not None:
            adder(sub)
    try:
        from sim.cli import register
    except ImportError:
        register = None
    if register is not None:
        register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EngramError as exc:
        print(f"engram {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
