"""Where a trace's text comes from: source specs resolved to files, prompt and token files read.

Sources are named by a short spec (see :func:`resolve_source`):

``stdlib:asyncio/base_events.py``
    a source file of Python's standard library (always present, no download);
``package:numpy/linalg/_linalg.py``
    a file inside an installed package;
``shared:promessi_sposi.txt``, ``shared:prompts.jsonl``, ``shared:agent_prompt_long.txt``
    the real corpora shipped in the package (``sim/data/``, :data:`SHARED_SOURCES`; read through
    :mod:`importlib.resources`), or the file of that name in the folder ``$ENGRAM_SHARED_DATA`` when it
    is set;
``text:...``
    the literal text after the colon;
``tokens:PATH``
    token ids (whitespace/comma separated integers, or a ``.npy`` array);
``synth:reuse=0.225,zipf=1.1,tokens=2000,seed=0,profile=code``
    a synthetic trace with a target reuse rate (:mod:`sim.trace.synth`);
a path
    ``.jsonl`` (prompts: one ``{"id", "prompt"}`` object a line), ``.npz`` (a
    saved trace), ``.npy`` (token ids), anything else is read as UTF-8 text.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path
from typing import Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.io import SHARED_DATA_ENV, read_jsonl, read_text, shared_data_dir

__all__ = ["CODE_SOURCE", "SHARED_SOURCES", "SYNTH_PREFIX", "TOKENIZED_KINDS", "builtin_sources", "encoded_by_tokenizer",
           "read_prompts", "read_token_file", "resolve_source"]

#: The built-in source-code trace: a large, plain module of the standard library.
CODE_SOURCE = "stdlib:asyncio/base_events.py"

#: Prefix of a synthetic trace's source spec (``synth:reuse=0.225,...``, :mod:`sim.trace.synth`).
SYNTH_PREFIX = "synth:"

#: Kinds of source (:func:`resolve_source`) whose token ids a tokenizer made: text, prompts, synthetic traces
#: (drawn from real text) and saved traces.  ``tokens`` files hold ids given as they are.
TOKENIZED_KINDS = ("text", "textfile", "prompts", "synth", "trace")


#: The texts shipped in the package (``sim/data/``) that ``shared:NAME`` names, with a line each.
SHARED_SOURCES = {
    "promessi_sposi.txt": "Italian novel, public domain",
    "prompts.jsonl": "100 short prompts, one sequence each",
    "agent_prompt_long.txt": "long system prompt of a coding agent (~37k tokens)",
}


def builtin_sources() -> dict[str, str]:
    """Named trace sources available on this machine, with a one-line description each."""
    out = {
        CODE_SOURCE: "Python standard library source (asyncio event loop), present with every Python",
        "stdlib:inspect.py": "Python standard library source (inspect module)",
    }
    data = shared_data_dir()
    for name, what in SHARED_SOURCES.items():
        if (data / name).is_file():
            out[f"shared:{name}"] = what
    out[f"{SYNTH_PREFIX}reuse=0.225"] = ("synthetic trace with a target reuse rate, shaped like coding context "
                                         "(also zipf=, tokens=, seed=, profile=code|prose)")
    return out


def read_prompts(path: Union[str, os.PathLike]) -> list[tuple[str, str]]:
    """``(id, prompt)`` pairs of a JSONL prompts file, in file order.

    Raises
    ------
    FormatError
        A non-empty line is not a JSON object with a string ``prompt`` (names the line).
    """
    out = []
    for lineno, obj in read_jsonl(path, "prompts file"):
        if not isinstance(obj.get("prompt"), str):
            raise FormatError(f"{path}: line {lineno}: expected an object with a string 'prompt'")
        out.append((str(obj.get("id", f"line{lineno}")), obj["prompt"]))
    return out


def read_token_file(path: Union[str, os.PathLike]) -> np.ndarray:
    """Token ids from a ``.npy`` array or a text file of integers (whitespace or comma separated).

    Raises
    ------
    FormatError
        The file cannot be read or holds something other than integers (names the item).
    """
    p = Path(path)
    try:
        if p.suffix == ".npy":
            try:
                arr = np.load(p, allow_pickle=False)
            except (ValueError, EOFError) as exc:
                raise FormatError(f"{p}: not a readable .npy array of token ids ({exc})") from None
            if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iu":
                raise FormatError(f"{p}: token array must hold integers, got "
                                  f"{getattr(arr, 'dtype', type(arr).__name__)}")
            if arr.ndim != 1:
                raise FormatError(f"{p}: token array must be one-dimensional [tokens], got shape {arr.shape}")
            return arr.astype(np.int64)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read token file ({exc.strerror})") from None
    items = read_text(p, "token file").replace(",", " ").split()
    out = np.empty(len(items), dtype=np.int64)
    for i, s in enumerate(items):
        try:
            out[i] = int(s)
        except ValueError:
            raise FormatError(f"{p}: item {i} ({s[:20]!r}) is not an integer token id") from None
    return out


def encoded_by_tokenizer(spec: str) -> bool:
    """Whether the token ids of source ``spec`` come from a tokenizer (to be checked against a model's vocabulary
    with :func:`sim.trace.tokens.check_model_vocabulary`), rather than given as ids.

    Raises as :func:`resolve_source`.
    """
    return resolve_source(spec)[0] in TOKENIZED_KINDS


def resolve_source(spec: str) -> tuple[str, Path | str]:
    """Resolve a source spec to ``(kind, what)``.

    ``kind`` is one of ``"text"`` (``what`` is the text itself), ``"synth"``
    (``what`` is the spec itself), ``"textfile"``, ``"prompts"``, ``"tokens"``,
    ``"trace"`` (``what`` is a path).

    Raises
    ------
    ArgumentError
        Unknown prefix, or the named file does not exist (names it).
    """
    if spec.startswith("text:"):
        return "text", spec[5:]
    if spec.startswith(SYNTH_PREFIX):
        return "synth", spec
    if spec.startswith("stdlib:"):
        path = Path(sysconfig.get_paths()["stdlib"]) / spec[7:]
    elif spec.startswith("package:"):
        rel = spec[8:]
        top, _, rest = rel.partition("/")
        found = importlib.util.find_spec(top)
        if found is None or not found.submodule_search_locations:
            raise ArgumentError(f"source {spec!r}: no installed package {top!r}")
        path = Path(list(found.submodule_search_locations)[0]) / rest
    elif spec.startswith("shared:"):
        path = shared_data_dir() / spec[7:]
        if not path.is_file():
            env = os.environ.get(SHARED_DATA_ENV)
            where = (f"the folder ${SHARED_DATA_ENV} = {env} names" if env
                     else "the package data (" + ", ".join(SHARED_SOURCES) + ")")
            raise ArgumentError(f"source {spec!r}: no file {path}: shared: names a file of {where}")
    elif spec.startswith("tokens:"):
        path = Path(spec[7:])
        if not path.is_file():
            raise ArgumentError(f"source {spec!r}: no file {path}")
        return "tokens", path
    elif spec.startswith("file:"):
        path = Path(spec[5:])
    else:
        path = Path(spec)
    if not path.is_file():
        raise ArgumentError(f"source {spec!r}: no file {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "prompts", path
    if suffix == ".npz":
        return "trace", path
    if suffix == ".npy":
        return "tokens", path
    return "textfile", path
