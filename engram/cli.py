"""The ``engram`` command.

Engine commands (``info``, ``hash``, ``inspect``, ``synth``, ``lookup``) live
here.  Other packages add commands through entry points of the group
``engram.commands`` (:data:`PLUGIN_GROUP`), the way numcodecs finds codecs:
an entry point ``NAME = module:function`` names a top-level command, and
``function(subparsers)`` adds it.  The simulator registers ``sim``,
``measure``, ``calibrate``, ``crosscheck``, ``report`` and ``demo`` that way
(``setup.cfg``), so the engine never imports it.

Plugins load lazily: reading the entry points imports nothing, ``engram
--help`` lists plugin commands by name, and only the plugin of the command
being run is imported.  A plugin that fails to load breaks only its own
command, which then exits 2 and says why on stderr.

:func:`print_json` and :func:`json_default` are shared with plugins, so every
command's ``--json`` output looks alike.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from typing import Dict, Optional, Sequence

import numpy as np

from . import __version__, synth
from ._native import hashing as _native_hashing
from .backends import auto_backend, available_backends, probe_backends, ring_build
from .codec import bf16_round, decode_path
from .errors import ArgumentError, EngramError, TokenError
from .gguf import ARCHITECTURES, read_model, repair_model
from .hashing import Hasher
from .layout import Layout
from .mixer import gate_path, project_path
from .model import EngramModel
from .options import Command, Exclusive, Option, add_command, add_options, replaced
from .table import DEFAULT_READERS, DEFAULT_THRESHOLD
from .tokenmap import build_token_map, load_tokenizer


def print_json(obj) -> None:
    """Write ``obj`` as indented JSON to stdout (NumPy scalars and arrays allowed)."""
    json.dump(obj, sys.stdout, indent=2, default=json_default)
    sys.stdout.write("\n")


def json_default(o):
    """``json`` fallback for NumPy integers, floats and arrays, and paths (as strings)."""
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# ----------------------------------------------------------------- progress
#: ``--no-progress``, the same words on every command that can take a while (``engram synth``, ``repair``, and
#: every simulator command that runs simulations or measurements).
NO_PROGRESS_HELP = ("never a progress bar (what a log file wants): plain progress lines on stderr every few "
                    "seconds instead, where the command has them")
#: ``--quiet``, the same words on every command that can take a while.
QUIET_HELP = "no progress output at all (results, warnings and errors are still printed)"
_PROGRESS_GROUP = "progress (on stderr; a bar on a terminal, plain lines elsewhere)"
#: ``--no-progress`` and ``--quiet``: the one declaration of both flags (:func:`add_progress_flags`).
PROGRESS_OPTIONS = (Option("--no-progress", action="store_true", help=NO_PROGRESS_HELP, group=_PROGRESS_GROUP),
                    Option("--quiet", action="store_true", help=QUIET_HELP, group=_PROGRESS_GROUP))
#: ``--json``, the same on every command.
JSON_OPTION = Option("--json", action="store_true", help="machine-readable output")


def add_progress_flags(p: argparse.ArgumentParser, **kw) -> None:
    """Add ``--no-progress`` and ``--quiet`` to the parser of a command that can take a while.

    The one declaration of both flags: every long command of ``engram`` and of its plugins calls this, and
    :func:`progress_choice` reads them, so they mean the same everywhere.  ``kw`` replaces fields of
    :data:`PROGRESS_OPTIONS` (``default=argparse.SUPPRESS`` on a subcommand that repeats its parent's options).
    """
    add_options(p, replaced(PROGRESS_OPTIONS, **kw))


def progress_choice(args: argparse.Namespace) -> str:
    """What the flags of :func:`add_progress_flags` ask for: ``"off"`` (``--quiet``), ``"lines"``
    (``--no-progress``: plain lines, never a bar) or ``"auto"`` (a bar on a terminal, plain lines elsewhere).

    These are the modes of ``sim.core.progress``; a command whose progress is a bar only (``engram synth``) shows
    it for ``"auto"`` where standard error is a terminal and nothing otherwise.
    """
    if getattr(args, "quiet", False):
        return "off"
    return "lines" if getattr(args, "no_progress", False) else "auto"


def _bar_wanted(args: argparse.Namespace) -> bool:
    """Whether a bar-only progress (tqdm) may be shown: neither flag given and no ``--json`` (and then only
    where standard error is a terminal: :func:`engram.gguf.write.bar_wanted`)."""
    return progress_choice(args) == "auto" and not getattr(args, "json", False)


# --------------------------------------------------------------------- info
def _cmd_info(args) -> int:
    status = probe_backends(refresh=True, warn=False)  # live: what starts and reads on this machine now
    auto, why = auto_backend()
    ring = status["io_uring"]
    info = {
        "version": __version__,
        "hash_kernel": "avx512" if _native_hashing._CPU_AVX512_PUBLIC() else "scalar",
        "decode_kernel": decode_path(),
        "gate_kernel": gate_path(),
        "project_kernel": project_path(),
        "read_backends": list(available_backends()),
        "io_uring_build": ring_build(),
        "io_uring": "starts and reads" if ring.usable else ring.reason,
        "usable_backends": [n for n, st in status.items() if st.usable],
        "auto_backend": auto,
        "auto_reason": why,
        "o_direct": hasattr(os, "O_DIRECT"),
    }
    if args.json:
        info["backends"] = {n: st.to_dict() for n, st in status.items()}
        print_json(info)
    else:
        for k, v in info.items():
            if v is None:
                continue
            print(f"{k:>15}: {', '.join(v) if isinstance(v, list) else v}")
    return 0


INFO_COMMAND = Command("info", "version, built kernels, read backends and the one auto uses here",
                       (JSON_OPTION,), _cmd_info,
                       description="Version, kernels in use, and the read backends: built, usable on this machine now "
                                   "(each proved live with a real read: the io_uring ring may be refused by the "
                                   "kernel, kernel.io_uring_disabled, seccomp or ENGRAM_DISABLE_IO_URING), and the one"
                                   ' backend="auto" uses, with the reason.')


# --------------------------------------------------------------------- hash
def _read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of a file the user named; ``ArgumentError`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ArgumentError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"{path}: the {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_tokens_file(path: str) -> np.ndarray:
    """Token ids from a file: whitespace/comma separated integers, or a .npy array."""
    if path.endswith(".npy"):
        try:
            return np.load(path, allow_pickle=False)
        except OSError as exc:
            raise ArgumentError(f"{path}: cannot read the token file: {exc.strerror or exc}") from None
        except ValueError as exc:  # not an .npy file, or an object array
            raise ArgumentError(f"{path}: not a numpy .npy array of token ids ({exc})") from None
    text = _read_text_file(path, "token file").replace(",", " ")
    try:
        vals = [int(x) for x in text.split()]
    except ValueError as exc:
        raise ArgumentError(f"{path}: token files hold integers ({exc})") from None
    for i, v in enumerate(vals):
        if not 0 <= v < 2**63:
            raise TokenError(f"{path}: token {v} at position {i} is outside any vocabulary")
    return np.array(vals, dtype=np.int64)


def _cmd_hash(args) -> int:
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
        print_json({"layer_ids": list(layout.layer_ids), "tokens": ids.tolist(), "rows": rows.tolist()})
    else:
        for t, tid in enumerate(ids.tolist()):
            for li, lid in enumerate(layout.layer_ids):
                print(f"token {t:>5} id {tid:>6} layer {lid:>2}: " + " ".join(str(r) for r in rows[t, li]))
    return 0


_TEXT_SOURCE = Exclusive("text or tokens", required=True)
#: The options of ``engram hash``.
HASH_OPTIONS = (
    Option("--text", help="text to tokenize with the DeepSeek V4 tokenizer", exclusive=_TEXT_SOURCE),
    Option("--tokens", help="file of token ids (integers, or .npy)", exclusive=_TEXT_SOURCE),
    Option("--compressed", action="store_true", help="the token ids are already compressed ids"),
    Option("--tokenizer", help="tokenizer.json (default: the DeepSeek V4 one)"),
    Option("--scale", type=float, default=1.0, help="bucket-size scale of the layout (default 1)"),
    JSON_OPTION,
)


HASH_COMMAND = Command("hash", "row ids of a text or token file under the V4.1 layout",
                       HASH_OPTIONS, _cmd_hash)


# ------------------------------------------------------------------ inspect
def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)  # pragma: no cover


def _cmd_inspect(args) -> int:
    info = read_model(args.model[0] if len(args.model) == 1 else args.model)
    if args.json:
        print_json(info.to_dict())
        return 0
    lay = info.layout
    print(f"model         {info.paths[0]}" + (f"  ({len(info.paths)} shards)" if len(info.paths) > 1 else ""))
    for p, size in zip(info.paths, info.file_sizes):
        print(f"  file        {p}  {size:,} bytes ({_fmt_bytes(size)})")
    print(f"format        GGUF v{info.version}, architecture {info.architecture}, alignment {info.alignment}")
    print(f"encoding      {info.encoding}")
    print(f"layers        {list(lay.layer_ids)}: {lay.columns} columns ({lay.max_ngram - 1} orders x "
          f"{lay.heads} heads), rows {[int(r) for r in lay.rows]}")
    print(f"token map     {info.token_map.shape[0]:,} token ids -> {lay.compressed_vocab_size:,} compressed, "
          f"pad id {lay.pad_id}")
    voc = info.vocabulary_summary()
    if voc is None:
        print("vocabulary    none (no tokenizer.ggml.tokens): text is checked against the token map")
    else:
        kind = "/".join(x for x in (voc["model"], voc["pre"]) if x) or "tokenizer"
        merges = f", {voc['merges']:,} merges" if voc["merges"] is not None else ", no merges"
        print(f"vocabulary    {kind}: {voc['tokens']:,} tokens{merges}, sha256 {voc['digest'][:16]}")
    print(f"gate eps      {info.eps:g}  ({info.sources['eps']})")
    unusual = {name: src for name, src in info.sources.items() if src.kind != "key"}
    if not unusual:
        print(f"keys          every constant from its {info.architecture}.* key")
    else:
        print(f"keys          {len(info.sources) - len(unusual)} constants from their {info.architecture}.* keys; "
              f"the others:")
        for name, src in unusual.items():
            print(f"  {name:<22} {src}")
    for li, lid in enumerate(lay.layer_ids):
        print(f"  layer {lid:>3}   primes {int(lay.primes[li, 0]):,} .. {int(lay.primes[li, -1]):,}  "
              f"multipliers {[int(m) for m in lay.multipliers[li]]}")
    print("tensors")
    width = max(len(n) for n in info.tensors)
    for t in sorted(info.tensors.values(), key=lambda t: (t.shard, t.offset)):
        shape = "[" + ", ".join(str(d) for d in t.gguf_shape) + "]"
        print(f"  {t.name:<{width}}  {t.ggml_type.name:<4} {shape:<18} shard {t.shard}  offset {t.offset:>16,}  "
              f"{_fmt_bytes(t.nbytes):>10}")
    print("tables")
    for lid, tab in info.tables.items():
        print(f"  layer {lid:>3}   {tab.path.name}  offset {tab.offset:,}  rows {tab.rows:,} x {tab.row_bytes} B"
              f"  = {_fmt_bytes(tab.nbytes)}  end {tab.end:,}")
    return 0


INSPECT_COMMAND = Command("inspect", "layout, tensors and table offsets of a model file (headers only)",
                          (Option("model", nargs="+", help="model .gguf, any shard of a split set, or all shard paths"),
                    JSON_OPTION), _cmd_inspect,
                          description="Read the GGUF headers of a model (never its tables) and print the Engram "
                                      "layout, every tensor with type/shape/offset/size, and the table offsets. "
                                      "Constants the file leaves out are shown as derived (or defaulted), keys read "
                                      "under their legacy deepseek4.* spelling as legacy keys.")


# -------------------------------------------------------------------- output paths
#: The rule of an output path (:func:`engram.gguf.write.check_outputs`), said once for synth and repair.
PARENTS_OPTION = Option("--parents", action="store_true",
                        help="make OUT's folder (and its parents) when missing; without it a missing folder is "
                             "refused (a mistyped path), as cp does. OUT may be absent or a regular file (replaced); "
                             "a directory, device, FIFO or socket is refused")


# -------------------------------------------------------------------- synth
def _cmd_synth(args) -> int:
    trace = None
    if args.trace_text is not None:
        text = _read_text_file(args.trace_text, "trace text")
        if args.trace_chars:
            text = text[: args.trace_chars]
        tok = load_tokenizer(args.tokenizer)
        trace = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    elif args.trace_tokens is not None:
        trace = _read_tokens_file(args.trace_tokens)
    if args.scale is None and not args.full_size:
        raise ArgumentError("give --scale S or --full-size")
    t0 = time.perf_counter()
    paths = synth.build_model(args.out,
                              synth.ModelShape(scale=args.scale, full_size=args.full_size, shards=args.shards,
                                               seed=args.seed, eps=args.eps, optional_keys=args.optional_keys,
                                               tokenizer_json=args.tokenizer,
                                               vocabulary=False if args.no_vocabulary else None),
                              synth.Fill(trace=trace, tables=args.fill, projections=not args.no_projections),
                              progress=_bar_wanted(args), writing=synth.Writing(sync=args.sync, parents=args.parents))
    dt = time.perf_counter() - t0
    files = []
    for p in paths:
        st = os.stat(p)
        files.append({"path": str(p), "size": st.st_size, "allocated": st.st_blocks * 512})
    allocated = sum(f["allocated"] for f in files)
    rec = {"files": files, "seconds": dt, "written_MBps": allocated / dt / 1e6 if dt > 0 else None,
           "trace_tokens": None if trace is None else int(trace.shape[0])}
    if args.json:
        print_json(rec)
    else:
        for f in files:
            print(f"wrote {f['path']}  {f['size']:,} bytes ({_fmt_bytes(f['size'])}), "
                  f"{_fmt_bytes(f['allocated'])} on disk")
        print(f"{dt:.2f} s, {rec['written_MBps']:.0f} MB/s on disk")
    return 0


_TRACE = Exclusive("trace")
#: The options of ``engram synth``.
SYNTH_OPTIONS = (
    Option("out", help="output .gguf (shards become OUT-0000k-of-0000N.gguf)"),
    Option("--scale", type=float, help="bucket-size scale of the layout, e.g. 0.001 (~101 MB a table)"),
    Option("--full-size", action="store_true",
           help="released layout (~94 GiB a table, sparse, tables at the released offsets)"),
    Option("--trace-text", metavar="FILE", help="text whose tokens' rows are written (sparse tables)",
           exclusive=_TRACE),
    Option("--trace-tokens", metavar="FILE", help="token ids (integers or .npy) whose rows are written",
           exclusive=_TRACE),
    Option("--trace-chars", type=int, default=0, help="use only the first N characters of --trace-text"),
    Option("--fill", choices=("all", "trace", "none"), help="table rows to write (default: trace with a trace, else all)"),
    Option("--shards", type=int, default=1, help="number of files of a split set (default 1)"),
    Option("--seed", type=int, default=0, help="content seed (default 0)"),
    Option("--eps", type=float, default=1e-6, help="gate epsilon stored in the file (default 1e-6)"),
    Option("--no-projections", action="store_true", help="leave engram_kv and the norms as zero holes"),
    Option("--optional-keys", action="store_true", help="also write offsets, head_count, key_length and max_ngram_size"),
    Option("--tokenizer", metavar="JSON",
           help="tokenizer.json the model is made for: its vocabulary and token map go in the file, and "
                "--trace-text is encoded with it (default: the DeepSeek V4 one)"),
    Option("--no-vocabulary", action="store_true",
           help="leave the tokenizer keys (tokenizer.ggml.tokens, merges, ...) out of the file"),
    Option("--sync", action="store_true", help="fsync the files before exiting"),
    PARENTS_OPTION,
    *PROGRESS_OPTIONS,
    JSON_OPTION,
)


SYNTH_COMMAND = Command("synth", "write a synthetic model in the real Engram GGUF format",
                        SYNTH_OPTIONS, _cmd_synth,
                        description="Write a DeepSeek V4.1 Flash-format model (GGUF v3, all Engram keys, real token "
                                    "map, engram_kv + norms, tables last) with deterministic rows. --scale shrinks the"
                                    " tables; --full-size keeps the released layout with sparse tables, writing only "
                                    "the rows a trace reads.")


# -------------------------------------------------------------------- repair
def _cmd_repair(args) -> int:
    paths = repair_model(args.model, args.out, prefer=args.prefer, eps=args.eps,
                         progress=_bar_wanted(args), parents=args.parents)
    info = read_model(paths[0] if len(paths) == 1 else paths)
    rec = {"files": [str(p) for p in paths], "sources": {k: str(v) for k, v in info.sources.items()}}
    if args.json:
        print_json(rec)
    else:
        for p in paths:
            print(f"wrote {p}")
        print(f"every Engram key now under {info.architecture}.engram.*; derived constants checked against the "
              f"tensors")
    return 0


_MODEL = Option("model", help="model .gguf (or one shard of a split set)")
#: The options of ``engram repair``.
REPAIR_OPTIONS = (
    _MODEL,
    Option("out", help="output .gguf (a split set becomes OUT-0000k-of-0000N.gguf)"),
    Option("--prefer", choices=ARCHITECTURES,
           help="where the two spellings of a primary key disagree, keep this prefix's value"),
    Option("--eps", type=float, help="gate epsilon to write (default: the file's own)"),
    PARENTS_OPTION,
    *PROGRESS_OPTIONS,
    JSON_OPTION,
)


REPAIR_COMMAND = Command("repair", "rewrite a model with the current Engram keys (legacy, missing or wrong "
                                      "derived keys)",
                         REPAIR_OPTIONS, _cmd_repair,
                         description="Write MODEL again as OUT with every Engram key under the current "
                                     "deepseek41.engram.* spelling: legacy deepseek4.engram.* keys renamed, derivable "
                                     "constants (rows, offsets, head_count, max_ngram_size, key_length, "
                                     "compressed_vocab_size) derived from the primary keys and checked against the "
                                     "tensors, every other key and all tensor data copied (holes stay holes). OUT "
                                     "appears only once complete.")


# -------------------------------------------------------------------- lookup
def _cmd_lookup(args) -> int:
    model = EngramModel.open(args.model, eps=args.eps, backend=args.backend, readers=args.readers,
                             threshold=args.threshold)
    tok = None
    if args.text is not None:
        tok = model.tokenizer(args.tokenizer, vocabulary="file" if args.file_vocabulary else "tokenizer")
        ids = np.array(tok.encode(args.text, add_special_tokens=False).ids, dtype=np.int64)
    else:
        ids = _read_tokens_file(args.tokens)
    lids = model.layer_ids
    streams = 4
    # The real residual comes from the model's own layers, which this tool does not run:
    # gates are computed against a seeded bf16-valued random residual.
    rng = np.random.default_rng(args.residual_seed)
    records = []
    with model.session() as s:
        for t, token in enumerate(ids.tolist()):
            t0 = time.perf_counter()
            rows = s.step(token)
            read_s = time.perf_counter() - t0
            row_ids = s.last_row_ids
            rec = {"position": t, "token": int(token), "read_ms": read_s * 1e3,
                   "backend": s.last_stats.backend, "rows_distinct": s.last_stats.rows_distinct,
                   "layers": {}}
            if tok is not None:
                rec["text"] = tok.decode([int(token)])
            for li, lid in enumerate(lids):
                entry = {"row_ids": row_ids[li].tolist()}
                if not args.no_gates:
                    w = model.weights(lid)
                    width = w.q_norm.shape[1]
                    residual = bf16_round(rng.standard_normal((1, streams, width)).astype(np.float32))
                    gates = np.zeros((1, streams), np.float32)
                    t1 = time.perf_counter()
                    s.apply(lid, residual, rows[lid][None], gates_out=gates)
                    entry["gates"] = [float(g) for g in gates[0]]
                    entry["mix_ms"] = (time.perf_counter() - t1) * 1e3
                rec["layers"][str(lid)] = entry
            records.append(rec)
    if args.json:
        print_json({"model": str(model.info.path), "layer_ids": list(lids), "tokens": records})
        return 0
    for rec in records:
        head = f"[{rec['position']:>4}] token {rec['token']:>6}"
        if "text" in rec:
            head += f" {rec['text']!r:<14}"
        print(f"{head} read {rec['read_ms']:7.3f} ms ({rec['backend']}, {rec['rows_distinct']} rows)")
        for lid, e in rec["layers"].items():
            ids_s = " ".join(str(r) for r in e["row_ids"][:4]) + " ..."
            gates = "" if "gates" not in e else "  gates " + " ".join(f"{g:.4f}" for g in e["gates"])
            print(f"       layer {lid:>2}: rows {ids_s}{gates}")
    return 0


_LOOKUP_SOURCE = Exclusive("text or tokens", required=True)
#: The options of ``engram lookup``.
LOOKUP_OPTIONS = (
    _MODEL,
    Option("--text", help="text to tokenize (checked against the model's vocabulary first)", exclusive=_LOOKUP_SOURCE),
    Option("--tokens", help="file of token ids (integers, or .npy)", exclusive=_LOOKUP_SOURCE),
    Option("--tokenizer", metavar="JSON",
           help="tokenizer.json that encodes --text (default: the DeepSeek V4 one); refused when its "
                "vocabulary is not the model's"),
    Option("--file-vocabulary", action="store_true",
           help="encode --text with the model file's own vocabulary and merges (tokenizer.ggml.*), "
                "with the pipeline of --tokenizer"),
    Option("--backend", default="auto", choices=("auto", "io_uring", "pread", "serial")),
    Option("--readers", type=int, default=DEFAULT_READERS, help=f"pread readers or io_uring depth (default {DEFAULT_READERS})"),
    Option("--threshold", type=int, default=DEFAULT_THRESHOLD,
           help=f"distinct rows for a concurrent read (default {DEFAULT_THRESHOLD})"),
    Option("--no-gates", action="store_true", help="skip projection and gates (no weights loaded)"),
    Option("--eps", type=float, help="gate epsilon (default: the file's, else 1e-6)"),
    Option("--residual-seed", type=int, default=0, help="seed of the stand-in residual (default 0)"),
    JSON_OPTION,
)


LOOKUP_COMMAND = Command("lookup", "per token: row ids, read timings and gates of a model",
                         LOOKUP_OPTIONS, _cmd_lookup,
                         description="Hash a text (or token file) with a model's layout, read each decode step's rows "
                                     "from its tables and mix them through the gate. Gates are computed against a "
                                     "seeded random residual, since this tool does not run the model's other layers. "
                                     "--text is encoded only by a tokenizer whose vocabulary is the model file's "
                                     "(tokenizer.ggml.tokens, or its token map in files without one): another "
                                     "tokenizer's ids would read other rows.")


# ------------------------------------------------------------------- plugins
#: Entry-point group of commands added to ``engram`` by other packages.
PLUGIN_GROUP = "engram.commands"

#: The engine's own commands; a plugin cannot replace them.
ENGINE_COMMANDS = ("info", "hash", "inspect", "synth", "lookup")


def plugin_commands() -> Dict[str, importlib.metadata.EntryPoint]:
    """Commands other packages add: entry-point name -> entry point, in the order found.

    Reading the entry points imports nothing.  Names of engine commands are
    ignored; of several entry points with one name, the first found wins.
    """
    eps = importlib.metadata.entry_points()
    group = eps.select(group=PLUGIN_GROUP) if hasattr(eps, "select") else eps.get(PLUGIN_GROUP, ())
    out: Dict[str, importlib.metadata.EntryPoint] = {}
    for ep in group:
        if ep.name not in ENGINE_COMMANDS:
            out.setdefault(ep.name, ep)
    return out


def _command_of(argv: Sequence[str]) -> Optional[str]:
    """The command word of ``argv``: its first argument that is not an option (``engram`` takes only -h)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _add_plugin(sub, name: str, ep: importlib.metadata.EntryPoint) -> None:
    """Load entry point ``ep`` and let it add command ``name``; on failure add a command that says why."""
    try:
        ep.load()(sub)
        if name not in sub.choices:
            raise LookupError(f"{ep.value} did not add a command named {name!r}")
    except Exception as exc:  # a broken plugin must not take the engine's commands down
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ModuleNotFoundError) and ep.module.partition(".")[0] == "sim":
            why += "; the simulator's commands need its extra: pip install 'engram[sim]'"
        p = sub.add_parser(name, help=f"unavailable: {why}", add_help=False, prefix_chars="\0")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args: _plugin_failed(name, ep, why))


def _plugin_failed(name: str, ep: importlib.metadata.EntryPoint, why: str) -> int:
    print(f"engram {name}: error: the command could not be loaded from {ep.value} ({why})", file=sys.stderr)
    return 2


def _add_plugin_stub(sub, name: str, ep: importlib.metadata.EntryPoint) -> None:
    """List plugin command ``name`` without importing it (its options: ``engram NAME --help``)."""
    sub.add_parser(name, help=f"from the {ep.module.partition('.')[0]} package: engram {name} --help")


# ---------------------------------------------------------------------- main
#: The engine's own commands, in ``--help`` order.
ENGINE_COMMAND_TABLE = (INFO_COMMAND, HASH_COMMAND, INSPECT_COMMAND, SYNTH_COMMAND, REPAIR_COMMAND, LOOKUP_COMMAND)


class CommandParser(argparse.ArgumentParser):
    """The parser of ``engram`` and, through argparse's subparsers (which make their parsers of their parent's
    class), of every command under it: an argument a command does not know is refused by that command's own
    parser, with its usage (``usage: engram calibrate [-h] ...``), not left for the top level, whose usage
    names no option of the command.  Only ``engram``'s own parsers are of this class; argparse's
    ``parse_known_args`` contract (unknown arguments returned) does not hold for them."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return namespace, extra


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The ``engram`` parser for the command line ``argv`` (default ``sys.argv[1:]``).

    Engine commands are always complete; of the plugin commands only the one
    ``argv`` runs is loaded, the others are listed by name.
    """
    parser = CommandParser(
        prog="engram",
        description="Serve and simulate the on-disk n-gram memory (Engram) of DeepSeek V4.1-class models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in ENGINE_COMMAND_TABLE:
        add_command(sub, cmd)
    wanted = _command_of(sys.argv[1:] if argv is None else argv)
    for name, ep in plugin_commands().items():
        if name == wanted:
            _add_plugin(sub, name, ep)
        else:
            _add_plugin_stub(sub, name, ep)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    name = getattr(args, "command_prog", None) or f"engram {args.command}"  # the (sub)command run, for its errors
    try:
        return int(args.func(args) or 0)
    except EngramError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # writers remove what they had begun (engram.gguf.atomic_outputs)
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # output piped into a reader that stopped early (e.g. `| head`): not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as exc:  # an ordinary failure of the system not yet given a type: one line, no traceback
        if exc.filename is None and not exc.strerror:
            raise
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"{name}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
