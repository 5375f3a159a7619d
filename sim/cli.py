"""``engram sim ...``: the simulator on the command line.

``engram sim trace``    build a trace from real text (or synthesize one with a target reuse rate), save it,
                        print its reuse statistics; export its reads as an fio I/O log
``engram sim decode``   predict decode tokens/s for a device, a read policy and a compute time
``engram sim prefill``  predict prefill time and stalls of one prompt
``engram sim device``   show (or save) a device model's latency and IOPS by queue depth
``engram measure``      measured decode runs of the real engine and its microbenchmarks
``engram calibrate``    fit the device and compute models from the microbenchmarks only
``engram crosscheck``   predicted vs measured decode runs, with the error table
``engram sim sweep``    a what-if study (TOML grid) in local processes or on a Dask cluster
``engram sim capacity`` the sessions each configuration of a study sustains at a target, searched (for a
                        serving study: the requests/s it carries under latency targets)
``engram sim serve``    a serving what-if: requests arriving, prefilled and decoded in continuous batches
``engram report``       the plotted report (Markdown, PNG figures, HTML)
``engram demo``         the main job: model file, traces, lookups, measurements, calibration,
                        cross-check, a sweep and the report

Every command's argparse is here, and only here.  ``setup.cfg`` registers one
``add_*_command`` function per top-level command as an entry point of the
group ``engram.commands``; ``engram`` loads the one it runs
(:mod:`engram.cli`).  Every subcommand takes ``--json`` for machine-readable
output.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from engram import EngramModel
from engram.cli import print_json
from engram.errors import ArgumentError, EngramError, TableIOError

from .calibrate import calibrate_file
from .capacity import (CAPACITY_MAX_SESSIONS, CAPACITY_SEEDS, CAPACITY_TARGET, grid_capacities, phases_short,
                       phases_text, probes_path, run_capacity)
from .crosscheck import crosscheck_files, markdown_table
from .decode import fit_compute, reference_compute, simulate_decode
from .demo import DEFAULT_OUT, DEFAULT_WORKDIR, run_demo
from .device import DEVICE_FORMS, SEED_REFERENCE, load_device, preset_names
from .io import OutputError, load_json
from .measure import (DEFAULT_DEPTHS, DEFAULT_SCALE, DEFAULT_TRACES, MEASURED_CAPACITY_TARGET, Settings, default_grid,
                      ensure_model, grid, measure, quick_grid, session_grid)
from .params import (BACKENDS, COMPUTE_DISTS, DEFAULT_LAYERS, DEFAULT_PHASES, DEFAULT_READERS, DEFAULT_THRESHOLD,
                     Compute, Phases, Policy)
from .prefill import simulate_prefill
from .report import REPORT_MAX_SESSIONS, REPORT_SEEDS, build_report
from .schema import SESSION_MODES, RunConfig
from .serve import SLO, ServeStudy, simulate_serve
from .serve.counterpart import counterpart_table, predict_counterpart
from .serve.engine import GATES
from .serve.measured import measure_counterpart
from .serve.runner import point_objects, resolve_serve_context
from .serve.search import probes_path as serve_probes_path
from .serve.search import knee_words, run_serve_capacity
from .serve.study import SERVE_AXES, check_serve_point, is_serve_study, serve_point_seed
from .serve.workload import ARRIVALS
from .sweep import PHASES_COLUMN, Study, meta_path, partial_path, run_study
from .trace import (CODE_SOURCE, PROFILES, load_trace, measure_profile, order_targets, reuse_stats,
                    synthesize)
from .trace.sources import encoded_by_tokenizer
from .trace.tokens import check_model_vocabulary
from .trace.iolog import DEFAULT_BLOCK, RELEASED_FILE, engine_block, model_tables, plan_reads, released_tables
from .trace.shape import DEFAULT_PROFILE, PROFILE_WINDOW
from .trace.synth import DEFAULT_TOKENS

__all__ = ["add_calibrate_command", "add_crosscheck_command", "add_demo_command", "add_measure_command",
           "add_report_command", "add_sim_command", "register"]

_DEFAULT_DEVICE = "seed-apple-m3-ultra"


def _typed_os_errors(func):
    """A command whose ordinary failures of the system on a file (no permission, a full disk, a missing or
    read-only folder) end as a typed error naming the file, never a traceback."""
    @functools.wraps(func)
    def run(args) -> int:
        try:
            return func(args)
        except EngramError:
            raise
        except OSError as exc:
            if exc.filename is None:  # not a file's failure (a closed pipe): the caller's to handle
                raise
            err = OutputError(f"{exc.filename}: {exc.strerror or exc.__class__.__name__}")
            err.errno, err.strerror, err.filename = exc.errno, exc.strerror, exc.filename
            raise err from None
    return run


def _ints(text: str) -> list:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _trace(args):
    return load_trace(args.trace or CODE_SOURCE, limit=args.limit)


def _add_trace_source(p, default_help: str) -> None:
    p.add_argument("--trace", metavar="SOURCE",
                   help="trace source: stdlib:PATH, package:PKG/PATH, shared:FILE, text:TEXT, tokens:FILE, "
                        f"or a .jsonl/.npz/.npy/text file (default {default_help})")
    p.add_argument("--limit", type=int, help="keep the first N tokens of the trace")


def _add_policy(p) -> None:
    g = p.add_argument_group("read policy (SPEC §8)")
    g.add_argument("--threshold", type=int, default=DEFAULT_THRESHOLD,
                   help=f"read concurrently from this many distinct rows a batch (default {DEFAULT_THRESHOLD})")
    g.add_argument("--backend", choices=BACKENDS, default="pread",
                   help="concurrent reads by a pread pool or an io_uring ring (default pread)")
    g.add_argument("--readers", type=int,
                   help="reads in flight of a concurrent batch, for either backend: pread threads or io_uring "
                        f"queue depth, as in engram.Table and engram measure (default {DEFAULT_READERS})")
    g.add_argument("--ring-depth", type=int, help="deprecated alias of --readers (io_uring only)")
    g.add_argument("--batch-overhead-us", type=float, default=0.0,
                   help="microseconds added to every concurrent batch (default 0)")


def _add_common(p) -> None:
    p.add_argument("--device", default=_DEFAULT_DEVICE,
                   help=f"device: {DEVICE_FORMS} (default {_DEFAULT_DEVICE}; see engram sim device)")
    p.add_argument("--calibration", metavar="FILE",
                   help="calibration file (engram calibrate) for --device calibrated or calibrated:BACKEND")
    p.add_argument("--compute-dist", default="constant", choices=COMPUTE_DISTS,
                   help="distribution of compute time, with the given mean and --compute-cv (default constant)")
    p.add_argument("--compute-cv", type=float,
                   help="coefficient of variation of compute (normal: at most 0.85; exponential: 1 by definition)")
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                   help=f"decoder layers compute spreads over (default {DEFAULT_LAYERS})")
    p.add_argument("--mode", choices=("fast", "exact"), default="fast",
                   help="fast: batches of reads share the device as segments; exact: every read is an event "
                        "(default fast)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--bins", type=int, default=100, help="bins of the queue-depth timeline (default 100)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _readers(args) -> int:
    """``--readers``, or its deprecated alias ``--ring-depth`` (io_uring only; both given must agree)."""
    if args.ring_depth is not None:
        if args.backend != "io_uring":
            raise ArgumentError("--ring-depth applies to --backend io_uring only; use --readers (pread threads "
                                "or io_uring depth)")
        if args.readers is not None and args.readers != args.ring_depth:
            raise ArgumentError(f"--ring-depth {args.ring_depth} and --readers {args.readers} differ: --ring-depth "
                                "is a deprecated alias of --readers, give --readers only")
        print("engram sim: --ring-depth is deprecated: --readers is the queue depth of either backend",
              file=sys.stderr)
        return args.ring_depth
    return DEFAULT_READERS if args.readers is None else args.readers


def _policy(args, **extra):
    return Policy(threshold=args.threshold, backend=args.backend, readers=_readers(args),
                  batch_overhead=args.batch_overhead_us * 1e-6, **extra)


def _device(args):
    """``--device`` (with ``--calibration`` for a calibrated one) through the one loader of every command."""
    spec = str(args.device)
    if args.calibration and not (spec == "calibrated" or spec.startswith("calibrated:")):
        raise ArgumentError(f"--calibration applies to --device calibrated (or calibrated:BACKEND), not "
                            f"{spec!r}; to use the calibration's device give it as --device FILE")
    return load_device(spec, args.calibration, backend=args.backend)


def _compute(args, mean: float):
    cv = 0.0 if args.compute_cv is None else args.compute_cv
    return Compute(mean, args.compute_dist, cv, (), args.layers)


# ----------------------------------------------------------------------- trace
class _DefaultSubcommand(argparse._SubParsersAction):
    """Subcommands where a first word that names none of them is the default one's first argument
    (``engram sim trace FILE`` is ``engram sim trace stats FILE``)."""

    default_command = ""

    class _AnyWord(dict):
        def __contains__(self, key) -> bool:  # argparse checks the first word against the choices
            return True

    def default_to(self, name: str) -> None:
        """Make ``name`` the default (call after every subcommand is added)."""
        self.default_command = name
        self._name_parser_map = self._AnyWord(self._name_parser_map)
        self.choices = self._name_parser_map

    def __call__(self, parser, namespace, values, option_string=None):
        if values and self.default_command and values[0] not in self._name_parser_map.keys():
            values = [self.default_command, *values]
        super().__call__(parser, namespace, values, option_string)


def _print_wrap(tr, args, out: dict) -> None:
    if args.steps is None:
        return
    w = tr.wraps(args.steps, args.sessions)
    out["run"] = w.to_dict()
    if not args.json:
        print(("WARNING   " if w.warning() else "run       ") + w.summary())


def _cmd_trace(args) -> int:
    tr = load_trace(args.source or CODE_SOURCE, limit=args.limit)
    saved = str(tr.save(args.out)) if args.out else None
    stats = reuse_stats(tr, args.lru or (), per_sequence=not args.one_session)
    d = stats.to_dict()
    if not args.json:
        print(f"trace     {tr.source}: {tr.steps} tokens, {stats.sequences} sequence(s), rows {list(tr.rows.shape)}")
        if saved:
            print(f"saved     {saved}")
        print(f"reuse     {stats.reuse_rate:.4f} of {stats.reads} row reads repeat an earlier (layer, row) "
              f"of the session")
        print("by order  " + "  ".join(f"{o}-gram {r:.4f}" for o, r in stats.by_order.items()))
        print("by layer  " + "  ".join(f"layer {lid} {r:.4f}" for lid, r in stats.by_layer.items()))
        for c, r in stats.lru.items():
            print(f"LRU       {c} rows: hit rate {r:.4f}")
    _print_wrap(tr, args, d)
    if args.json:
        d.update(saved=saved, shape=list(tr.rows.shape))
        print_json(d)
    return 0


def _add_trace_stats_options(p, default=None) -> None:
    """The options of ``engram sim trace [stats]`` (``default=SUPPRESS`` on the ``stats`` subcommand, whose
    values then add to those given before it)."""
    kw = {} if default is None else {"default": default}
    p.add_argument("--limit", type=int, help="keep the first N tokens", **kw)
    p.add_argument("--out", help="save the trace to this .npz file", **kw)
    p.add_argument("--lru", type=_ints, help="LRU cache sizes in rows to report, comma separated", **kw)
    p.add_argument("--one-session", action="store_true",
                   help="treat all sequences of the trace as one session (default: each is its own)", **kw)
    p.add_argument("--steps", type=int, metavar="N",
                   help="a planned run of N steps per session: say whether it wraps past the end of the trace", **kw)
    p.add_argument("--sessions", type=int, metavar="S",
                   help="sessions of the planned run (default 1; with --steps)", **({"default": 1} if not kw else kw))
    p.add_argument("--json", action="store_true", help="machine-readable output", **kw)


_SOURCE_HELP = ("trace source (default stdlib:asyncio/base_events.py): stdlib:PATH, package:PKG/PATH, shared:FILE, "
                "text:TEXT, tokens:FILE, synth:reuse=R[,zipf=S,tokens=N,seed=K,profile=code|prose], "
                "or a .jsonl/.npz/.npy/text file")


def _cmd_trace_synth(args) -> int:
    tr = synthesize(args.reuse, zipf=args.zipf, tokens=args.tokens, seed=args.seed, profile=args.profile)
    saved = str(tr.save(args.out)) if args.out else None
    stats = reuse_stats(tr, args.lru or ())
    want = order_targets(PROFILES[args.profile], args.reuse)
    d = {"spec": tr.source, "saved": saved, "target": args.reuse, "stats": stats.to_dict(),
         "target_by_order": {str(o): r for o, r in want.items()}, "shape": list(tr.rows.shape)}
    if args.json:
        print_json(d)
        return 0
    print(f"trace     {tr.source}: {tr.steps} tokens, rows {list(tr.rows.shape)}")
    if saved:
        print(f"saved     {saved} (load it anywhere a trace is named, or rebuild it from the spec)")
    print(f"reuse     {stats.reuse_rate:.4f} (target {args.reuse:.4f}) of {stats.reads} row reads")
    print("by order  " + "  ".join(f"{o}-gram {stats.by_order[o]:.4f} (target {want[o]:.4f})" for o in (2, 3, 4)))
    for c, r in stats.lru.items():
        print(f"LRU       {c} rows: hit rate {r:.4f}")
    return 0


def _cmd_trace_profile(args) -> int:
    prof = measure_profile(load_trace(args.source, limit=args.limit), window=args.window)
    if args.json:
        print_json(prof.to_dict())
        return 0
    print(f"profile   {prof.source}: {prof.windows} window(s) of {prof.window} tokens")
    print(f"reuse     {prof.reuse_rate:.4f}; by order "
          + "  ".join(f"{o}-gram {r:.4f}" for o, r in prof.by_order.items()))
    print("levels    share " + "  ".join(f"{i + 1}: {x:.4f}" for i, x in enumerate(prof.level_distribution())))
    for i, row in enumerate(prof.transitions):
        print(f"          from level {i + 1} to 1..4: " + "  ".join(f"{x:.4f}" for x in row))
    print(f"copies    distance law d**-{prof.zipf:g} for d >= {prof.min_distance}")
    return 0


def _iolog_block(args, tables) -> tuple:
    """The read alignment and where it came from."""
    if args.block_size not in (None, "auto"):
        try:
            return int(args.block_size), "given"
        except ValueError:
            raise ArgumentError(f"--block-size must be a number of bytes or 'auto', got {args.block_size!r}") from None
    if args.model:
        got = engine_block(tables[0])
        if got is not None:
            return got, "the engine's O_DIRECT alignment for this file on this machine"
        return DEFAULT_BLOCK, "O_DIRECT refused on this file system: 4 KiB"
    if args.block_size == "auto":
        raise ArgumentError("--block-size auto needs --model (the engine's alignment for that file)")
    return DEFAULT_BLOCK, "4 KiB (SPEC §8)"


def _cmd_trace_iolog(args) -> int:
    tr = load_trace(args.trace, limit=args.limit)
    if args.model:
        tables, layout, token_map = model_tables(args.model)
        if encoded_by_tokenizer(args.trace):  # the trace's ids must be the model's, or its rows are others
            check_model_vocabulary(args.model)
    else:
        tables, layout, token_map = released_tables(args.filename), None, None
    block, why = _iolog_block(args, tables)
    plan = plan_reads(tr, tables, layout=layout, token_map=token_map, block=block, steps=args.steps,
                      sessions=args.sessions)
    step_us = None
    if args.step_ms is not None or args.tokens_per_s is not None:
        step_us = args.step_ms * 1e3 if args.step_ms is not None else 1e6 / args.tokens_per_s
        if step_us <= 0:
            raise ArgumentError("--step-ms and --tokens-per-s must be > 0")
    version = 3 if step_us is not None else 2
    out = Path(args.out)
    paths = [plan.write(out, version, step_us)] if args.sessions == 1 else [
        plan.session_plan(s).write(out.with_name(f"{out.stem}.s{s}{out.suffix}"), version, step_us)
        for s in range(args.sessions)]
    depth = args.iodepth
    jobs = " ".join(f"--name=s{i} --read_iolog={p}" for i, p in enumerate(paths))
    cmd = (f"fio --direct=1 --readonly --ioengine=io_uring --iodepth={depth} {jobs}"
           + ("" if args.model else " --replay_redirect=DEVICE_OR_FILE"))
    d = {"logs": [str(p) for p in paths], "version": version, "step_us": step_us, "block_source": why,
         "tables": [t.__dict__ for t in tables], "fio": cmd, **plan.summary()}
    d["run"] = tr.wraps(plan.steps, args.sessions).to_dict()
    if args.json:
        print_json(d)
        return 0
    mib = plan.bytes / 2 ** 20
    print(f"iolog     {', '.join(map(str, paths))} (fio iolog v{version}"
          + (f", a step every {step_us:.0f} us" if step_us else ", as fast as fio can") + ")")
    print(f"reads     {plan.reads} reads, {mib:.2f} MiB: {plan.reads / (plan.steps * plan.sessions):.2f} reads, "
          f"{plan.bytes / (plan.steps * plan.sessions) / 1024:.1f} KiB a step; {args.sessions} session(s) x "
          f"{plan.steps} steps of {tr.source}")
    print(f"block     {block} bytes ({why})")
    print("tables    " + "; ".join(f"layer {t.layer_id} at byte {t.offset:,} of {t.path}" for t in tables))
    if d["run"]["warning"]:
        print("WARNING   " + d["run"]["warning"])
    print(f"replay    {cmd}")
    return 0


def _add_trace(sub) -> None:
    p = sub.add_parser("trace", help="traces: build from real text or synthesize, reuse statistics, fio I/O logs",
                       description="With a SOURCE (or none): tokenize real text with the DeepSeek V4 tokenizer, hash "
                                   "it under the V4.1 layout into row ids per step [T, 2, 24], optionally save them "
                                   "(.npz), and print how often row reads repeat (by n-gram order and layer), LRU hit "
                                   "rates, and whether a planned run (--steps, --sessions) wraps past its end. "
                                   "Subcommands: synth (a trace with a target reuse rate), profile (the per-order "
                                   "reuse shape of a text), iolog (the exact reads as an fio I/O log).")
    _add_trace_stats_options(p)
    p.set_defaults(func=_typed_os_errors(_cmd_trace), source=None)
    tsub = p.add_subparsers(dest="trace_command", metavar="[SUBCOMMAND] [SOURCE]", action=_DefaultSubcommand)

    s = tsub.add_parser("stats", help="reuse statistics of a trace source (the default: `engram sim trace SOURCE`)",
                        description="Build or load a trace and print its reuse statistics (see engram sim trace).")
    s.add_argument("source", nargs="?", help=_SOURCE_HELP)
    _add_trace_stats_options(s, argparse.SUPPRESS)
    s.set_defaults(func=_typed_os_errors(_cmd_trace))

    s = tsub.add_parser("synth", help="a synthetic trace with a target reuse rate and Zipf skew",
                        description="Synthesize a token stream whose hashed rows repeat at the target reuse rate "
                                    "(share of row reads that repeat an earlier (layer, row) of the trace), with the "
                                    "per-order shape measured on real text (--profile) and a Zipf law of how far back "
                                    "repeats copy from (--zipf); hash it with the real tokenizer map and layout. Any "
                                    "command loads it by its spec, e.g. synth:reuse=0.225,zipf=1.1,tokens=2000,seed=0.")
    s.add_argument("--reuse", type=float, required=True, help="target reuse rate in [0, 1), e.g. 0.225")
    s.add_argument("--zipf", type=float, help="exponent of the copy-distance law (default: the profile's, "
                                              f"code {PROFILES['code'].zipf:g}, prose {PROFILES['prose'].zipf:g})")
    s.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"steps (default {DEFAULT_TOKENS})")
    s.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    s.add_argument("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE,
                   help=f"per-order shape: code (coding-agent context) or prose (a novel) (default {DEFAULT_PROFILE})")
    s.add_argument("--out", help="save the trace to this .npz file")
    s.add_argument("--lru", type=_ints, help="LRU cache sizes in rows to report, comma separated")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_typed_os_errors(_cmd_trace_synth))

    s = tsub.add_parser("profile", help="the per-order reuse shape of a text (what synth reproduces)",
                        description="Measure a trace's reuse profile on windows of --window tokens: reuse by n-gram "
                                    "order, the match-level transition law, the copy-distance law.")
    s.add_argument("source", help=_SOURCE_HELP)
    s.add_argument("--window", type=int, default=PROFILE_WINDOW, help=f"tokens per window (default {PROFILE_WINDOW})")
    s.add_argument("--limit", type=int, help="keep the first N tokens")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_typed_os_errors(_cmd_trace_profile))

    s = tsub.add_parser("iolog", help="the exact reads of a trace as an I/O log that fio --read_iolog replays",
                        description="Plan the engine's reads of every decode step (per table: distinct rows, "
                                    "block-aligned spans, rows sharing or touching a block in one read) and write them "
                                    "as an fio iolog: version 2 (as fast as fio's queue depth allows) or, with "
                                    "--step-ms/--tokens-per-s, version 3 with one timestamp a step. Offsets are those "
                                    "of --model (its layout hashes the trace's tokens), else of the released V4.1 "
                                    "Flash file (SPEC §6); replay on a device with --replay_redirect.")
    s.add_argument("trace", help=_SOURCE_HELP)
    s.add_argument("--out", required=True, help="the .iolog file (with --sessions S: STEM.sK.iolog each)")
    s.add_argument("--model", help="model file (GGUF, or one shard) whose table offsets and layout to use")
    s.add_argument("--filename", default=RELEASED_FILE,
                   help=f"file name written for the released layout's tables (default {RELEASED_FILE})")
    s.add_argument("--block-size", help="read alignment in bytes, or 'auto' (with --model: the engine's alignment "
                                        "for that file here); default auto with --model, else 4096")
    s.add_argument("--limit", type=int, help="keep the first N tokens of the trace")
    s.add_argument("--steps", type=int, help="steps per session (default the trace length; wraps around)")
    s.add_argument("--sessions", type=int, default=1,
                   help="sessions, each its own log, started as the decode model starts them (default 1)")
    t = s.add_mutually_exclusive_group()
    t.add_argument("--step-ms", type=float, help="one step every this many ms (iolog version 3 timestamps)")
    t.add_argument("--tokens-per-s", type=float, help="one step every 1/R s (iolog version 3 timestamps)")
    s.add_argument("--iodepth", type=int, default=DEFAULT_READERS,
                   help=f"queue depth in the suggested fio command (default {DEFAULT_READERS}, the engine's readers)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_typed_os_errors(_cmd_trace_iolog))
    tsub.default_to("stats")


# ---------------------------------------------------------------------- decode
def _decode_compute(args, tr, dev, policy) -> tuple:
    """(compute seconds a step, how it was chosen): given, or fitted on the reference device and kept for
    every device (``--refit``: on this device)."""
    fitting = args.fit_tokens_per_s is not None or args.fit_threshold is not None or args.refit
    if args.compute_ms is not None:
        if fitting:
            raise ArgumentError("--fit-threshold and --refit apply when the compute is fitted, not with "
                                "--compute-ms")
        return args.compute_ms * 1e-3, None
    ref = SEED_REFERENCE
    target = args.fit_tokens_per_s or ref["serial_tokens_per_s"]
    thr = args.fit_threshold if args.fit_threshold is not None else ref["serial_threshold"]
    if args.refit:
        fit_policy = Policy(threshold=thr, backend=policy.backend, readers=policy.readers,
                            batch_overhead=policy.batch_overhead)
        c = fit_compute(target, tr, dev, fit_policy, mode=args.mode, seed=args.seed)
        on = dev.name
    elif target == ref["serial_tokens_per_s"] and thr == ref["serial_threshold"]:
        c, on = reference_compute(tr, mode=args.mode), ref["device"]
    else:
        fit_policy = Policy(threshold=thr, readers=ref["readers"])
        c = fit_compute(target, tr, ref["device"], fit_policy, mode=args.mode, seed=args.seed)
        on = ref["device"]
    return c, {"tokens_per_s": target, "threshold": thr, "compute_ms": c * 1e3, "fitted_on": on,
               "refit": bool(args.refit)}


def _phases(args) -> Phases:
    if args.start_spread_ms is not None:
        if args.phases is not None:
            raise ArgumentError("give --phases or --start-spread-ms (deprecated: --phases spread:MS), not both")
        return Phases("spread", args.start_spread_ms * 1e-3) if args.start_spread_ms > 0 else Phases("lockstep")
    return Phases.parse(args.phases or DEFAULT_PHASES)


def _cmd_decode(args) -> int:
    tr = _trace(args)
    dev = _device(args)
    policy = _policy(args, cache_rows=args.cache_rows, overlap_layers=args.overlap_layers,
                     shared_cache_rows=args.shared_cache_rows, dram_fraction=args.dram_fraction)
    compute_s, fitted = _decode_compute(args, tr, dev, policy)
    r = simulate_decode(tr, dev, policy, _compute(args, compute_s), sessions=args.sessions, steps=args.steps,
                        mode=args.mode, seed=args.seed, phases=_phases(args), drives=args.drives,
                        hot=args.dram_rows, tail=args.tail, calibration=args.calibration, bins=args.bins,
                        progress=not args.no_progress)
    if args.json:
        d = r.to_dict()
        d["fitted_compute"] = fitted
        print_json(d)
        return 0
    if fitted:
        kept = "" if fitted["refit"] or fitted["fitted_on"] == r.device["name"] else \
            f", kept for {r.device['name']} (compute belongs to the model, not the disk; --refit fits it here)"
        print(f"compute   {fitted['compute_ms']:.4f} ms a step, fitted on {fitted['fitted_on']} so that threshold "
              f"{fitted['threshold']} gives {fitted['tokens_per_s']} tokens/s{kept}")
    print(r.summary())
    return 0


def _add_decode(sub) -> None:
    p = sub.add_parser("decode", help="predict decode tokens/s (simpy model)",
                       description="Replay real token traces through a device model and a read policy and "
                                   "predict decode tokens/s, step latency percentiles and device utilisation "
                                   "(SPEC §9). Without --compute-ms the compute of a step is that of the SPEC §8 "
                                   "reference run -- fitted on the reference device so that threshold 256 gives "
                                   "19.16 tokens/s -- and kept whatever --device: compute belongs to the model "
                                   "and its accelerator, not to the disk (--refit fits it on --device instead). "
                                   "Sessions start at random phases (--phases).")
    _add_trace_source(p, "stdlib:asyncio/base_events.py")
    _add_common(p)
    _add_policy(p)
    g = p.add_argument_group("decode")
    g.add_argument("--sessions", type=int, default=1, help="concurrent sessions sharing the device (default 1)")
    g.add_argument("--steps", type=int, help="steps per session (default: the trace length; longer runs replay "
                                             "the trace, with a warning)")
    g.add_argument("--phases", metavar="random|lockstep|spread:MS",
                   help="when sessions start: random (default; each at a random time within one step, seeded: "
                        "independent sessions as a server sees them), lockstep (all at once: the worst case), "
                        "spread:MS (session i at i x MS / sessions ms)")
    g.add_argument("--start-spread-ms", type=float, help="deprecated: --phases spread:MS")
    g.add_argument("--cache-rows", type=int, default=0, help="per-session LRU row cache in rows (default 0)")
    g.add_argument("--shared-cache-rows", type=int, default=0,
                   help="one LRU row cache shared by all sessions, rows (default 0)")
    g.add_argument("--dram-fraction", type=float, default=0.0,
                   help="share of each table resident in DRAM, chosen by a hash of the row id (default 0)")
    g.add_argument("--dram-rows", metavar="FILE.npy",
                   help="a hot set resident in DRAM: row ids [m] (every table) or (table index, row id) [m, 2]")
    g.add_argument("--drives", type=int, default=1, help="identical drives the tables are striped over by row id "
                                                         "(default 1)")
    g.add_argument("--tail", metavar="DEVICE",
                   help="take the latency distribution (tail) of this measured device at every depth, keeping "
                        "--device's means (e.g. a fio JSON file or vm-virtio-16core-4k)")
    g.add_argument("--overlap-layers", type=int, default=0,
                   help="layers of compute before the second table's rows are needed (default 0: none; at most "
                        "--layers)")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--compute-ms", type=float, help="mean compute time of a step, ms")
    c.add_argument("--fit-tokens-per-s", type=float,
                   help="fit the compute so that --fit-threshold gives this rate on the reference device "
                        "(default 19.16)")
    g.add_argument("--fit-threshold", type=int, help="threshold of the fitting run (default 256)")
    g.add_argument("--refit", action="store_true",
                   help="fit the compute on --device instead of the reference device (a slower disk then "
                        "gets less compute: for reproducing a measured run, not for comparing devices)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_typed_os_errors(_cmd_decode))


# --------------------------------------------------------------------- prefill
def _cmd_prefill(args) -> int:
    if args.compute_tokens_per_s is not None:
        if args.compute_tokens_per_s <= 0:
            raise ArgumentError(f"--compute-tokens-per-s must be > 0, got {args.compute_tokens_per_s}")
        per_token = 1.0 / args.compute_tokens_per_s
    else:
        per_token = args.compute_us_per_token * 1e-6
    if args.trace is None:
        args.trace = "shared:agent_prompt_long.txt"
    tr = _trace(args)
    r = simulate_prefill(tr, _device(args), _policy(args), _compute(args, per_token),
                         chunk=args.chunk, ubatch=args.ubatch, second_start_layer=args.second_start_layer,
                         mode=args.mode, seed=args.seed, bins=args.bins, progress=not args.no_progress)
    if args.json:
        print_json(r.to_dict())
    else:
        print(r.summary())
    return 0


def _add_prefill(sub) -> None:
    p = sub.add_parser("prefill", help="predict prefill time and stalls of one prompt",
                       description="A prompt's rows are hashed, then streamed by one background reader per "
                                   "table in chunks; compute runs layer by layer and waits at an Engram layer "
                                   "until its chunk is read (SPEC §8). Predicts prefill time and stalls.")
    _add_trace_source(p, "shared:agent_prompt_long.txt")
    _add_common(p)
    _add_policy(p)
    g = p.add_argument_group("prefill")
    c = g.add_mutually_exclusive_group(required=True)
    c.add_argument("--compute-tokens-per-s", type=float, help="prefill speed of compute alone, tokens/s")
    c.add_argument("--compute-us-per-token", type=float, help="compute per token through all layers, us")
    g.add_argument("--chunk", type=int, default=2048, help="tokens per reader chunk (default 2048)")
    g.add_argument("--ubatch", type=int, help="tokens per compute micro-batch (default: --chunk)")
    g.add_argument("--second-start-layer", type=int, default=2,
                   help="layer at which the second table's reader starts (default 2)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_typed_os_errors(_cmd_prefill))


# ---------------------------------------------------------------------- device
def _cmd_device(args) -> int:
    if args.name is None:
        names = preset_names()
        if args.json:
            print_json({"presets": names, "forms": DEVICE_FORMS})
        else:
            print("presets: " + ", ".join(names))
            print(f"forms:   {DEVICE_FORMS}")
        return 0
    spec = str(args.name)
    if args.calibration and not (spec == "calibrated" or spec.startswith("calibrated:")):
        raise ArgumentError("--calibration applies to the device 'calibrated' (or calibrated:BACKEND)")
    dev = load_device(spec, args.calibration, backend=args.backend)
    saved = str(dev.save(args.save)) if args.save else None
    info = dev.describe()
    if args.qd:
        info["table"] = dev.table(args.qd)
    if args.json:
        info["saved"] = saved
        print_json(info)
        return 0
    print(f"device  {info['name']} ({info['kind']})")
    print(f"source  {info['source']}")
    for key, d in info.get("derived", {}).items():
        print(f"derived {key} = {d['value']:g}: {d['rule']}")
    print(f"serves  {info['saturation_depth']} reads at once; peak {info['peak_iops']:.0f} IOPS")
    print(f"{'qd':>5} {'mean us':>10} {'p50 us':>10} {'p99 us':>10} {'IOPS':>10}")
    for r in info["table"]:
        print(f"{r['qd']:>5} {r['mean_us']:>10.1f} {r['p50_us']:>10.1f} {r['p99_us']:>10.1f} {r['iops']:>10.0f}")
    if saved:
        print(f"saved   {saved}")
    return 0


def _add_device(sub) -> None:
    p = sub.add_parser("device", help="show or save a device model (latency and IOPS by queue depth)",
                       description="Print a device model's per-read latency and IOPS at each queue depth and "
                                   "what was derived from what was given; with no name, list the presets and "
                                   "the accepted forms. Every command reads devices the same way.")
    p.add_argument("name", nargs="?", help=DEVICE_FORMS)
    p.add_argument("--calibration", metavar="FILE", help="calibration file for the device 'calibrated'")
    p.add_argument("--backend", choices=BACKENDS, default="pread",
                   help="backend whose device to take from a calibration (default pread)")
    p.add_argument("--qd", type=_ints, help="queue depths to show, comma separated")
    p.add_argument("--save", help="write the model as JSON (reload with --device FILE.json)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_typed_os_errors(_cmd_device))


# --------------------------------------------------------------------- measure
def _typed_errors(fn):
    """A command whose ordinary failures (permissions, a full disk, a missing file) end in a typed error naming
    the path, not a traceback."""
    @functools.wraps(fn)
    def run(args):
        try:
            return fn(args)
        except EngramError:
            raise
        except OSError as exc:
            where = exc.filename or "a file"
            raise TableIOError(f"{where}: {exc.strerror or exc}", errno_=exc.errno or 0) from None

    return run


def _strs(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def _measure_configs(args) -> list:
    """The configurations of ``engram measure``: the product of the axes given, else the quick or default grid,
    plus every ``--config``, without repeats."""
    steps = args.steps or (60 if args.quick else 200)
    axes = (args.traces, args.thresholds, args.backends, args.readers, args.computes)
    if any(a is not None for a in axes):
        configs = grid(args.traces or list(DEFAULT_TRACES), args.thresholds or [8, 256],
                       args.backends or list(BACKENDS), args.readers or [4, 16], args.computes or ["none"], steps)
    elif args.quick:
        configs = quick_grid(args.steps or 60)
    elif args.config or args.sessions:
        configs = []
    else:
        configs = default_grid(args.steps or 200, args.io_steps, args.mixer_steps)
    configs += [RunConfig.parse(t, steps) for t in args.config or ()]
    if args.sessions:
        modes = args.modes or list(SESSION_MODES)
        for m in modes:
            if m not in SESSION_MODES:
                raise ArgumentError(f"--modes: unknown mode {m!r} ({', '.join(SESSION_MODES)})")
        configs += session_grid((args.traces or [DEFAULT_TRACES[0]])[0], args.session_steps or steps,
                                args.sessions, modes)
    for be in args.backends or ():
        if be not in BACKENDS:
            raise ArgumentError(f"--backends: unknown backend {be!r} (pread, io_uring)")
    seen, unique = set(), []
    for c in configs:
        if c.key not in seen:
            seen.add(c.key)
            unique.append(c)
    return unique


def _measure_settings(args) -> Settings:
    """The settings of ``engram measure`` (``--quick``: short microbenchmarks, no waiting)."""
    q = args.quick
    return Settings(rounds=args.rounds or (2 if q else 7),
                    depths=args.depths or ([1, 4, 16] if q else list(DEFAULT_DEPTHS)),
                    micro=args.only != "runs", decode=args.only != "micro", fio=not args.no_fio,
                    fio_seconds=args.fio_seconds or (0.2 if q else 0.5),
                    io_batches=args.io_batches or (20 if q else 150), io_chunks=args.io_chunks or (2 if q else 8),
                    big_seconds=0.05 if q else 0.1, single_rows=50 if q else 200,
                    compute_samples=20 if q else 100, mixer_samples=5 if q else 15, seed=args.seed,
                    max_background_cpu=None if (args.no_wait or q) else args.max_background,
                    max_background_iops=args.max_background_iops, wait_budget=args.wait_budget,
                    capacity_target=args.capacity_target, probe_every=args.probe_every)


@_typed_errors
def _cmd_measure(args) -> int:
    work = Path(args.workdir)
    scale = args.scale if args.scale is not None else (0.001 if args.quick else DEFAULT_SCALE)
    configs = _measure_configs(args)
    need_mixer = any(c.compute.startswith("mixer") for c in configs)
    model = Path(args.model) if args.model else work / f"model-s{scale:g}.gguf"
    ensure_model(model, scale, build=not args.no_build, progress=not args.no_progress,
                 projections=need_mixer or not args.quick)
    res = measure(model, configs, work, _measure_settings(args), progress=not args.no_progress)
    res["model"] = str(model)
    if args.json:
        print_json(res)
        return 0
    print(f"measured  {res['configs']} configurations, {res['runs_done']} runs in {res['seconds']:.1f} s "
          f"({res['waited_s']:.1f} s waiting for a quiet machine; model {model})")
    print(f"backends  {', '.join(res['backends']['usable'])}"
          + "".join(f"; left out {b}: {why}" for b, why in res["backends"]["left_out"].items()))
    for w in res.get("warnings", []):
        print(f"warning   {w}")
    for k in ("microbench", "runs"):
        if res[k]:
            print(f"wrote     {res[k]}")
    if res["runs"]:
        doc = load_json(res["runs"], "decode_runs")
        by = {}
        for r in doc["runs"]:
            by.setdefault(r["config"], []).append(r)
        print(f"{'configuration':<62} {'tokens/s':>9} {'spread':>7} {'slowest':>8} {'p50 ms':>8} {'p95 ms':>8} "
              f"{'threads':>7}")
        for key, rs in by.items():
            t = np.array([r["tokens_per_s"] for r in rs])
            sp = (t.max() - t.min()) / np.median(t) if t.size > 1 else 0.0
            slow = np.median([r.get("slowest_tokens_per_s", r["tokens_per_s"]) for r in rs])
            print(f"{key:<62} {np.median(t):>9.1f} {sp * 100:>6.1f}% {slow:>8.1f} "
                  f"{np.median([r['step_ms']['p50'] for r in rs]):>8.3f} "
                  f"{np.median([r['step_ms']['p95'] for r in rs]):>8.3f} {max(r.get('threads', 0) for r in rs):>7}")
        print(f"capacity  the largest session count whose slowest session reaches {args.capacity_target:g} tokens/s: "
              "engram crosscheck gives it, measured and predicted")
    return 0


def _add_measure(sub) -> None:
    p = sub.add_parser("measure", help="measure real decode runs and the engine's microbenchmarks",
                       description="Run the real decode loop (hash -> one concurrent batch of 48 rows from a model "
                                   "file in the real format -> decode -> projection + gated add as the step's "
                                   "compute) over real traces, for a grid of thresholds x readers x backends x "
                                   "traces x compute, recording per step the read, compute and step time; and the "
                                   "microbenchmarks the calibration uses (the engine's reads by queue depth, fio "
                                   "by iodepth when installed, the step's compute, the hash). Writes "
                                   "WORKDIR/microbench.json, WORKDIR/runs.json and WORKDIR/traces/. The model's "
                                   "other layers do not exist here: add an emulated load per step with a compute "
                                   "spec (spin:MS, sleep:MS, blas:N; mixer = the Engram projection + gated add; "
                                   "join with +). Default grid (29 configurations): compute spin:2 on the "
                                   "Italian novel, the agent prompt and Python source x {serial (threshold 256), "
                                   "threshold 8 x pread/io_uring x 4/16 readers}; no compute (800 steps) on the "
                                   "novel and the agent prompt x the same 5 policies; spin:2 on the 100 short "
                                   "prompts, serial and io_uring x 16; the mixer on the novel, serial and io_uring "
                                   "x 16; and 1, 2, 4, 8, 16, 32 concurrent decode sessions (threads of one process; 2 to 32 as "
                                   "processes sharing the device) on the novel, each session on its own stretch, "
                                   "pread x 4, compute sleep:5 (a step's accelerator work, no CPU of this machine), "
                                   "recording every session's tokens/s, step latency, start offset and the threads "
                                   "used. 7 interleaved rounds, every run on its own stretch of its trace, with "
                                   "probe steps (random token ids through the same sessions) interleaved. Only the "
                                   "read backends that start here are measured; the others are named with the "
                                   "reason.")
    p.add_argument("workdir", help="directory for the results (and the model file unless --model)")
    g = p.add_argument_group("model file")
    g.add_argument("--model", help="model .gguf to read (built there when missing; default WORKDIR/model-sSCALE.gguf)")
    g.add_argument("--scale", type=float, help="layout scale of the model (default 0.02: two 2.03 GB tables; "
                                               "--quick 0.001)")
    g.add_argument("--no-build", action="store_true", help="fail instead of building a missing model file")
    g = p.add_argument_group("grid (any axis given replaces the default grid by the product of the axes)")
    g.add_argument("--traces", type=_strs, help="comma-separated trace sources (default: the 4 default traces)")
    g.add_argument("--thresholds", type=_ints, help="thresholds (default 8,256)")
    g.add_argument("--backends", type=_strs, help="pread and/or io_uring (default both)")
    g.add_argument("--readers", type=_ints, help="readers = ring depths (default 4,16)")
    g.add_argument("--computes", type=_strs, help="compute specs (default none)")
    g.add_argument("--config", action="append", metavar="TRACE/THRESHOLD/BACKEND/READERS[/COMPUTE[/STEPS]]",
                   help="an extra configuration (repeatable)")
    g.add_argument("--sessions", type=_ints, metavar="N,N,...",
                   help="also run N concurrent decode sessions on the first trace, each on its own stretch, "
                        "threshold 8, pread x 4, compute sleep:5 (e.g. 1,2,4,8,16,32; the default grid has them)")
    g.add_argument("--modes", type=_strs, help="sessions as threads of one process and/or processes sharing the "
                                               "device (default threads,processes)")
    g.add_argument("--session-steps", type=int, help="steps of each session (default --steps)")
    g.add_argument("--capacity-target", type=float, default=MEASURED_CAPACITY_TARGET,
                   help=f"tokens/s the slowest session must reach to count in the capacity (default "
                        f"{MEASURED_CAPACITY_TARGET:g})")
    g.add_argument("--steps", type=int, help="decode steps per run (default 200; --quick 60)")
    g.add_argument("--io-steps", type=int, default=800,
                   help="steps of the default grid's runs without compute (default 800)")
    g.add_argument("--mixer-steps", type=int, default=30, help="steps of the default grid's mixer runs (default 30)")
    g = p.add_argument_group("measurement")
    g.add_argument("--rounds", type=int, help="interleaved rounds: repeats of every run (default 7; --quick 2)")
    g.add_argument("--depths", type=_ints, help="queue depths of the I/O microbenchmarks (default 1,2,4,8,16,32,64)")
    g.add_argument("--io-batches", type=int, help="48-row batches per microbenchmark chunk (default 150)")
    g.add_argument("--io-chunks", type=int,
                   help="chunks a round of 48-row batches where runs without compute read (default 8; --quick 2)")
    g.add_argument("--probe-every", type=int, default=Settings.probe_every, metavar="K",
                   help="a probe step (a random token id through the run's own sessions) before every K-th step "
                        "of a decode run and after its last: the device and compute of the run's own time window "
                        f"(default {Settings.probe_every}; 0: none)")
    g.add_argument("--no-fio", action="store_true", help="skip fio even when installed")
    g.add_argument("--fio-seconds", type=float, help="seconds per fio depth (default 0.5)")
    g.add_argument("--only", choices=("micro", "runs"), help="only the microbenchmarks or only the decode runs")
    g.add_argument("--max-background", type=float, default=0.25, metavar="SHARE",
                   help="wait before each task until other processes use at most this share of all CPUs (and "
                        "--max-background-iops), and redo a task when they used more during it (default 0.25)")
    g.add_argument("--max-background-iops", type=float, default=1000.0,
                   help="disk requests a second by others on the model's device tolerated (default 1000)")
    g.add_argument("--wait-budget", type=float, default=120.0,
                   help="seconds of waiting for a quiet machine in all, then measure regardless (default 120)")
    g.add_argument("--no-wait", action="store_true", help="never wait or redo (background load is still recorded)")
    g.add_argument("--quick", action="store_true",
                   help="small and fast: 6 configurations x 60 steps, 2 rounds, depths 1,4,16, short "
                        "microbenchmarks, a scale-0.001 model, no waiting for a quiet machine")
    g.add_argument("--seed", type=int, default=0, help="seed of row ids, orders and residuals (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_measure)


# ------------------------------------------------------------------- calibrate
@_typed_errors
def _cmd_calibrate(args) -> int:
    work = Path(args.workdir)
    micro = Path(args.microbench) if args.microbench else work / "microbench.json"
    out = Path(args.out) if args.out else work / "calibration.json"
    cal = calibrate_file(micro, out, seed=args.seed)
    if args.json:
        d = cal.to_dict()
        d["saved"] = str(out)
        print_json(d)
        return 0
    print(cal.summary())
    print(f"saved        {out}")
    return 0


def _add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the simulator's device and compute models from microbenchmarks",
                       description="Fit the device model (per backend: 48-row batch service time by readers, read "
                                   "latency by queue depth) and the compute model (measured step compute, "
                                   "resampled) from WORKDIR/microbench.json only; decode runs are refused. "
                                   "Writes WORKDIR/calibration.json (machine, file, date, fitted parameters).")
    p.add_argument("workdir", help="directory of engram measure's results")
    p.add_argument("--microbench", help="microbenchmark file (default WORKDIR/microbench.json)")
    p.add_argument("--out", help="calibration file (default WORKDIR/calibration.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of the diagnostic makespan sampling (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_calibrate)


# ------------------------------------------------------------------ crosscheck
@_typed_errors
def _cmd_crosscheck(args) -> int:
    work = Path(args.workdir)
    cal = Path(args.calibration) if args.calibration else work / "calibration.json"
    runs = Path(args.runs) if args.runs else work / "runs.json"
    out = Path(args.out) if args.out else work / "crosscheck.json"
    res = crosscheck_files(cal, runs, out, sim_steps=args.sim_steps, seed=args.seed, progress=not args.no_progress)
    if args.json:
        res["saved"] = str(out)
        print_json(res)
    else:
        print(markdown_table(res))
        print(f"\nsaved {out}")
    return 1 if args.strict and not res["summary"]["passed"] else 0


def _add_crosscheck(sub) -> None:
    p = sub.add_parser("crosscheck", help="predict every measured run with the calibrated simulator; error table",
                       description="Replay each measured configuration's trace through the simulator with the "
                                   "calibrated device and compute models, and compare predicted with measured "
                                   "tokens/s and step p50/p95 (medians over repeats), next to the spread of the "
                                   "repeats. Targets: tokens/s median |error| <= 5%, max <= 10%; step p50 max "
                                   "|error| <= 10%. Writes WORKDIR/crosscheck.json.")
    p.add_argument("workdir", help="directory of engram measure's and engram calibrate's results")
    p.add_argument("--calibration", help="calibration file (default WORKDIR/calibration.json)")
    p.add_argument("--runs", help="decode runs file (default WORKDIR/runs.json)")
    p.add_argument("--out", help="output file (default WORKDIR/crosscheck.json)")
    p.add_argument("--sim-steps", type=int, help="simulated steps per configuration (default max(steps, 2000))")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_crosscheck)


# ----------------------------------------------------------------------- sweep
def _progress_mode(args) -> str:
    """``--quiet``: nothing; ``--no-progress``: plain periodic lines, never a bar; else a bar on a terminal."""
    if getattr(args, "quiet", False):
        return "off"
    return "lines" if args.no_progress else "auto"


def _add_run_options(p, what: str) -> None:
    """Options shared by ``sweep`` and ``capacity``: where and how the points run."""
    p.add_argument("study", help="study TOML file")
    p.add_argument("--out", help=f"{what}, .csv or .parquet (default STUDY.csv in the current directory); rows "
                                 "are written as they finish")
    p.add_argument("--resume", action="store_true",
                   help="continue an unfinished run: keep the finished rows of --out and run only the others")
    p.add_argument("--jobs", type=int, help="local worker processes (default: CPU count; 1 = in this process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://10.0.0.5:8786)")
    p.add_argument("--calibration", help="calibration.json for 'calibrated' devices and computes")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: plain progress lines on stderr every few seconds instead")
    p.add_argument("--quiet", action="store_true", help="no progress output at all")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _out_path(args) -> Path:
    return Path(args.out) if args.out else Path(f"{Path(args.study).stem}.csv")


def _interrupted(out: Path, what: str, rows: Optional[Path] = None) -> int:
    """Ctrl-C during a run: say where the finished rows (``rows``, default the table ``out``) are and how to
    go on."""
    rows = rows or out
    meta = meta_path(rows)
    done = "its finished rows are in"
    try:
        m = load_json(meta)
        done = f"{m.get('points_done', '?')} finished rows are in"
    except EngramError:
        pass
    print(f"engram sim {what}: interrupted; {done} {partial_path(rows)} (complete: false in {meta}); "
          f"continue with --resume --out {out}", file=sys.stderr)
    return 130


def _cmd_sweep(args) -> int:
    if is_serve_study(args.study):
        raise ArgumentError(f"{args.study} is a serving study ([serve], [slo]): engram sim capacity {args.study} "
                            "searches the requests/s of each configuration; engram sim serve "
                            f"{args.study} --point N runs one")
    study = Study.load(args.study)
    if study.capacity is not None:
        raise ArgumentError(f"{args.study} is a capacity study ([capacity]): run it with engram sim capacity "
                            f"{args.study}")
    out = _out_path(args)
    try:
        res = run_study(study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                        progress=_progress_mode(args), out=out, resume=args.resume)
    except KeyboardInterrupt:
        return _interrupted(out, "sweep")
    axes = res.study.axes()
    path = res.table
    if args.json:
        print_json({"table": str(path), "meta": str(meta_path(path)), "points": len(res.rows),
                    "seconds": res.seconds, "runner": res.runner, "axes": axes, "resumed": res.resumed,
                    "lost_runs": res.lost, "complete": res.complete})
        return 0
    print(f"study     {res.study.name}: {len(res.rows)} points over {', '.join(axes) or 'no varying axis'}")
    print(f"ran       {res.seconds:.1f} s on {res.runner}"
          + (f"; {res.resumed} points taken from the earlier run" if res.resumed else "")
          + (f"; {res.lost} point runs lost with their worker and run again" if res.lost else ""))
    for line in _sweep_findings(res.rows, axes):
        print(line)
    print(f"wrote     {path} (+ .meta.json); plot it with: engram report --sweep {path}")
    return 0


def _sweep_findings(rows, axes) -> list:
    """The lines that sum a sweep up: the best point, or with ``sessions`` varying, the capacity read off it."""
    if "sessions" not in axes:
        best = max(rows, key=lambda r: r["session_tokens_per_s"])
        return ["best      " + (", ".join(f"{a}={best[a]}" for a in axes) or "the one point") +
                f": {best['session_tokens_per_s']:.2f} tokens/s per session"
                + (f" ({best['sessions']} sessions, phases {phases_text(best)})" if best["sessions"] > 1 else "")]
    lines = []
    for key, cap, bound, top in grid_capacities(rows, CAPACITY_TARGET):
        what = ", ".join(f"{a}={v}" for a, v in key.items()) or "all points"
        group = [r for r in rows if all(r[a] == v for a, v in key.items())]
        phases = sorted({phases_text(r) for r in group if r["sessions"] > 1}) or [phases_text(group[0])]
        lines.append(f"grid      {what}: {'>= ' if bound else ''}{cap} sessions at {CAPACITY_TARGET:g} tokens/s "
                     f"(slowest session; read off the grid up to {top}; phases {' / '.join(phases)})")
    lines.append("          (a grid only brackets the capacity: engram sim capacity searches it with a seed "
                 "ensemble)")
    return lines


def _add_sweep(sub) -> None:
    """Add ``sweep`` to the ``engram sim`` subcommands."""
    p = sub.add_parser("sweep", help="run a what-if study (a TOML grid) locally or on a Dask cluster",
                       description="Run every point of a study file (a grid over device, policy, cache, "
                                   "sessions, compute and trace; see studies/*.toml) through the decode "
                                   "simulator, in parallel local processes or on a running Dask cluster, and "
                                   "write one row per point (CSV, or Parquet with pyarrow) as each finishes; "
                                   "TABLE.meta.json says whether the table is complete and which points are "
                                   "missing. Each point's seed derives from the study seed and the point, so "
                                   "every runner gives the same table. A point whose worker dies is run again "
                                   "(at most 3 times); an interrupted run keeps its rows and continues with "
                                   "--resume. Capacity studies (with a [capacity] table) run with engram sim "
                                   "capacity.")
    _add_run_options(p, "results table")
    p.set_defaults(func=_typed_os_errors(_cmd_sweep))


# -------------------------------------------------------------------- capacity
def _cmd_capacity(args) -> int:
    if is_serve_study(args.study):
        return _cmd_serve_capacity(args)
    for flag in ("min_rate", "max_rate", "rate_resolution"):
        if getattr(args, flag) is not None:
            raise ArgumentError(f"--{flag.replace('_', '-')} applies to serving studies ([serve] and [slo] tables)")
    study = Study.load(args.study)
    out = _out_path(args)
    try:
        res = run_capacity(study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                           progress=_progress_mode(args), out=out, resume=args.resume, target=args.target,
                           seeds=args.seeds, max_sessions=args.max_sessions, resolution=args.resolution)
    except KeyboardInterrupt:
        return _interrupted(out, "capacity", probes_path(out))
    axes = [a for a in study.axes()]
    spec = res.spec
    if args.json:
        print_json({"table": str(res.table), "meta": str(meta_path(res.table)),
                    "probes": str(probes_path(res.table)), "capacity": spec.to_dict(), "seconds": res.seconds,
                    "runner": res.runner, "resumed_probes": res.resumed,
                    "configurations": [{**{a: c.config[a] for a in axes}, "capacity": c.capacity, "low": c.low,
                                        "high": c.high, "per_seed": c.per_seed, "lower_bound": c.lower_bound,
                                        "probes": len(c.probes), "phases": c.row()[PHASES_COLUMN],
                                        "compute_mean_ms": c.compute_ms,
                                        "compute_realised_mean_ms": c.compute_realised[0],
                                        "compute_realised_cv": c.compute_realised[1],
                                        "assumptions": c.assumptions()}
                                       for c in res.capacities]})
        return 0
    print(f"study     {study.name}: {len(res.capacities)} configuration(s); the largest session count whose "
          f"slowest session reaches {spec.target:g} tokens/s, searched with {spec.seeds} seeds up to "
          f"{spec.max_sessions} sessions")
    print(f"ran       {res.seconds:.1f} s on {res.runner}; {sum(len(c.probes) for c in res.capacities)} probes"
          + (f" ({res.resumed} taken from the earlier run)" if res.resumed else ""))
    shared = {c.assumptions() for c in res.capacities}
    if len(shared) == 1:
        print(f"assumes   {shared.pop()}")
    for c in res.capacities:
        what = ", ".join(f"{a}={c.config[a]}" for a in axes) or "the configuration"
        print(f"capacity  {what}: {c.label()}; {phases_short(c.phases)}")
        if len({x.assumptions() for x in res.capacities}) > 1:
            print(f"          assumes {c.assumptions()}")
    print(f"wrote     {res.table} (+ .meta.json, .probes.csv); plot it with: engram report --sweep {res.table}")
    return 0


def _add_capacity(sub) -> None:
    """Add ``capacity`` to the ``engram sim`` subcommands."""
    p = sub.add_parser("capacity", help="search the sessions each configuration of a study sustains at a target",
                       description="For every point of a capacity study (a study file with a [capacity] table; "
                                   "see studies/capacity.toml), find the largest number of concurrent sessions "
                                   "whose slowest session still decodes at the target tokens/s: probe 1, 2, 4, "
                                   "... sessions until one fails, then bisect, once per seed of an ensemble; "
                                   "report the median with the smallest and largest capacity over the seeds, "
                                   "and every assumption (compute per step, batching, session phases, the "
                                   "target's headroom under the compute-only ceiling). Writes one row per "
                                   "configuration and every probe (STUDY.csv.probes.csv) as they finish; "
                                   "locally or on a Dask cluster like sweeps. A serving study (with [serve] and "
                                   "[slo] tables; see studies/serve.toml) is searched on the arrival rate "
                                   "instead: the most requests/s whose p99 TTFT and TBT meet the targets.")
    _add_run_options(p, "capacity table")
    g = p.add_argument_group("search (override the study's [capacity] table)")
    g.add_argument("--target", type=float, help=f"tokens/s every session must reach (default {CAPACITY_TARGET:g})")
    g.add_argument("--seeds", type=int, help=f"searches per configuration, each its own seeds "
                                              f"(default {CAPACITY_SEEDS})")
    g.add_argument("--max-sessions", type=int, help=f"largest count probed (default {CAPACITY_MAX_SESSIONS})")
    g.add_argument("--resolution", type=int, help="bisect until the bracket is this many sessions wide (default 1)")
    g = p.add_argument_group("serving studies (override the study's [search] table)")
    g.add_argument("--min-rate", type=float, help="requests/s probed first (default 0.5)")
    g.add_argument("--max-rate", type=float, help="the largest requests/s probed (default 64)")
    g.add_argument("--rate-resolution", type=float,
                   help="bisect until the bracket is this share of its top (default 0.05)")
    p.set_defaults(func=_typed_os_errors(_cmd_capacity))


def _cmd_serve_capacity(args) -> int:
    for flag in ("target", "max_sessions", "resolution"):
        if getattr(args, flag) is not None:
            raise ArgumentError(f"--{flag.replace('_', '-')} applies to session capacity studies; a serving study "
                                "takes --min-rate, --max-rate, --rate-resolution")
    study = ServeStudy.load(args.study)
    out = _out_path(args)
    try:
        res = run_serve_capacity(study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                                 progress=_progress_mode(args), out=out, resume=args.resume, seeds=args.seeds,
                                 min_rate=args.min_rate, max_rate=args.max_rate, resolution=args.rate_resolution)
    except KeyboardInterrupt:
        return _interrupted(out, "capacity", serve_probes_path(out))
    axes = [a for a in study.axes() if a not in ("rate", "repeat")]
    if args.json:
        print_json({"table": str(res.table), "meta": str(meta_path(res.table)),
                    "probes": str(serve_probes_path(res.table)), "search": res.search.to_dict(),
                    "slo": study.slo.to_dict(), "seconds": res.seconds, "runner": res.runner,
                    "resumed_probes": res.resumed, "configurations": [r for r in res.rows()]})
        return 0
    sr = res.search
    print(f"study     {study.name}: {len(res.capacities)} configuration(s); the most requests/s meeting "
          f"{study.slo.text()}, searched with {sr.seeds} seeds from {sr.min_rate:g} up to {sr.max_rate:g} "
          f"requests/s (to {sr.resolution:.0%})")
    print(f"ran       {res.seconds:.1f} s on {res.runner}; {sum(len(c.probes) for c in res.capacities)} probes"
          + (f" ({res.resumed} taken from the earlier run)" if res.resumed else ""))
    for c in res.capacities:
        what = ", ".join(f"{a}={c.config[a]}" for a in axes) or "the configuration"
        knee = knee_words(*c.knee())
        print(f"capacity  {what}: {c.label()}" + (f"; above it: {knee}" if knee else ""))
    print(f"wrote     {res.table} (+ .meta.json, .probes.csv)")
    return 0


# ----------------------------------------------------------------------- serve
def _serve_point(args) -> tuple:
    """(point, seed, SLO, calibration) of ``engram sim serve``: a study's point (``--point``) or the axes' defaults,
    then every axis flag given."""
    flags = {a: getattr(args, a) for a in SERVE_AXES if getattr(args, a, None) is not None}
    if args.study:
        study = ServeStudy.load(args.study)
        pts = study.points()
        if not 0 <= args.point < len(pts):
            raise ArgumentError(f"--point {args.point}: {args.study} has points 0..{len(pts) - 1}")
        p, slo, cal, study_seed = dict(pts[args.point]), study.slo, study.calibration, study.seed
    else:
        p = {k: d for k, (_, d, _) in SERVE_AXES.items()}
        slo, cal, study_seed = SLO(), None, None
    p.update(flags)
    slo = SLO(args.ttft_s if args.ttft_s is not None else slo.ttft_s,
              args.tbt_ms if args.tbt_ms is not None else slo.tbt_ms,
              args.percentile if args.percentile is not None else slo.percentile)
    if args.seed is not None:
        seed = args.seed
    else:
        seed = serve_point_seed(study_seed, p) if study_seed is not None else 0
    return p, seed, slo, args.calibration or cal


def _cmd_serve_counterpart(args) -> int:
    """``engram sim serve --counterpart MODEL``: the real engine measured on MODEL, then predicted."""
    model = EngramModel.open(args.counterpart)
    spec = args.trace or CODE_SOURCE
    batch, steps, prompt = 8, 60, 4096
    text = load_trace(spec, limit=prompt + batch * 5 * steps)
    rec = measure_counterpart(args.counterpart, text.tokens, batch=batch, steps=steps, prompt_tokens=prompt,
                              backend=args.backend or "pread", readers=args.readers or DEFAULT_READERS,
                              threshold=args.threshold or DEFAULT_THRESHOLD, source=spec)
    res = predict_counterpart(rec, text.tokens, model.layout, seed=args.seed or 0)
    table = counterpart_table(res)
    if args.json:
        print_json({"record": rec, "result": res, "table": table})
        return 0
    g = rec["regime"]
    print(f"counterpart {batch} requests decoding ({rec['config']['compute_ms']:g} ms compute a step, slept) while a "
          f"{prompt}-token prompt prefills, on {args.counterpart} ({spec})")
    print(f"regime      {g['cpus']} CPUs, load average {g['load_before'][0]:.1f} before and {g['load_after'][0]:.1f} "
          f"after; backend {g['backend_used']}, {'O_DIRECT' if g['o_direct'] else 'buffered reads'}")
    print("device      probed: " + ", ".join(f"qd {d['qd']} {d['mean_us']:.0f} us" for d in rec["device"]))
    for r in table:
        print(f"{r['quantity']:<52} measured {r['measured']:>10.4g} {r['unit']:<5} predicted {r['predicted']:>10.4g} "
              f"{r['unit']:<5} ratio {r['ratio']:.3f}")
    return 0


def _cmd_serve(args) -> int:
    if args.counterpart:
        return _cmd_serve_counterpart(args)
    p, seed, slo, cal = _serve_point(args)
    check_serve_point(p, "engram sim serve")
    point_objects(p)  # every value checked before the text is tokenized
    ctx = resolve_serve_context([p], slo, cal)
    o = point_objects(p, ctx)
    key_dev = next(iter(ctx.devices.values()))
    r = simulate_serve(o["workload"], key_dev, o["policy"], o["compute"], o["scheduler"], slo, drives=p["drives"],
                       seed=seed, warmup=p["warmup_s"], bins=args.bins, requests_file=ctx.files.get(p["requests"]),
                       rows=next(iter(ctx.rows.values())))
    if args.json:
        d = r.to_dict()
        d["point"] = p
        print_json(d)
    else:
        print(r.summary())
    return 0


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="a serving what-if: requests arriving, prefilled and decoded in batches",
                       description="Simulate one serving configuration: requests arrive open-loop (Poisson, gamma "
                                   "or replayed), each prompt's rows stream from the device in 2048-token chunks "
                                   "while the engine computes prompt chunks and decodes the running requests in "
                                   "continuous batches, every step reading its batch's rows once across requests. "
                                   "Prints TTFT, time between tokens, TPOT and end-to-end percentiles, throughput, "
                                   "goodput under the SLOs, where a token's time goes, the device and Little's law. "
                                   "Every axis of a serving study is a flag; with STUDY.toml, --point picks one of "
                                   "its points and the flags override it. The compute of a step defaults to the "
                                   "SPEC §8 reference step (47.01 ms at batch 1) plus 2.137 ms a token (ds4's "
                                   "468 tokens/s prefill on an M3 Ultra): --compute-scale for a faster "
                                   "accelerator, --compute-file for measured steps.")
    p.add_argument("study", nargs="?", help="a serving study TOML file (optional)")
    p.add_argument("--point", type=int, default=0, help="the study's point to run (default 0)")
    g = p.add_argument_group("axes (as in a serving study; default: the study's point, else the axis default)")
    choices = {"arrivals": ARRIVALS, "gate": GATES}
    for name, (typ, default, label) in SERVE_AXES.items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, type=typ, choices=choices.get(name),
                       help=f"{label} (default {default!r})")
    g = p.add_argument_group("latency targets (default: the study's [slo], else p99 TTFT <= 2 s, TBT <= 100 ms)")
    g.add_argument("--ttft-s", type=float, help="time to first token target, seconds")
    g.add_argument("--tbt-ms", type=float, help="time between tokens target, ms")
    g.add_argument("--percentile", type=float, help="percentile both targets apply to (default 99)")
    p.add_argument("--calibration", metavar="FILE", help="calibration file for --device calibrated")
    p.add_argument("--seed", type=int, help="random seed (default: the study point's, else 0)")
    p.add_argument("--bins", type=int, default=100, help="bins of the timeline (default 100)")
    p.add_argument("--counterpart", metavar="MODEL.gguf",
                   help="instead: measure the real engine on MODEL (8 requests decoding in one batched read a step "
                        "while a 4,096-token prompt prefills in the background; the device probed first) and print "
                        "the serving model's prediction of it beside the measurement (--trace is the text)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_typed_os_errors(_cmd_serve))


# ---------------------------------------------------------------------- report
def _cmd_report(args) -> int:
    try:
        md = build_report(args.out, workdir=args.workdir, sweeps=args.sweep or (), traces=args.trace,
                          html_page=not args.no_html, self_contained=not args.linked_figures, target=args.target,
                          compute_ms=args.compute_ms, seeds=args.seeds, max_sessions=args.max_sessions,
                          quick=args.quick, jobs=args.jobs, title=args.title, progress=_progress_mode(args))
    except KeyboardInterrupt:
        print(f"engram report: interrupted; {args.out} is incomplete", file=sys.stderr)
        return 130
    figs = sorted(p.name for p in (md.parent / "figures").glob("*.png"))
    if args.json:
        print_json({"report": str(md), "html": str(md.with_suffix(".html")) if not args.no_html else None,
                    "self_contained": not args.linked_figures, "figures": figs})
    else:
        print(f"report    {md}" + ("" if args.no_html else f"  (and {md.with_suffix('.html')}"
                                   + (", one self-contained file)" if not args.linked_figures else ")")))
        print(f"figures   {len(figs)} in {md.parent / 'figures'}; their numbers in {md.parent / 'data'}")
    return 0


def add_report_command(subparsers) -> None:
    """Add ``engram report``."""
    p = subparsers.add_parser("report", help="plotted report: measured, predicted, what-if (Markdown + PNG + HTML)",
                              description="Write a report folder (report.md, report.html, figures/*.png, "
                                          "data/*.csv, inputs/). It leads with the answer: how many concurrent "
                                          "sessions each device sustains at the target tokens/s (searched with a "
                                          "seed ensemble; with the assumptions and the band over seeds), from its "
                                          "own search and from every capacity table given; then the evidence: "
                                          "the SPEC §8 seed reproduction, predicted vs measured with the error "
                                          "band, tokens/s by threshold, readers and row-cache size, step-latency "
                                          "CDFs, and the figures of sweep tables. Give a folder of engram measure "
                                          "/ calibrate (/ crosscheck) results for this machine's figures; without "
                                          "one, the figures use the device presets. report.html is one "
                                          "self-contained file (figures and data embedded) to send on.")
    p.add_argument("workdir", nargs="?", help="measurement folder (microbench.json, runs.json, calibration.json, "
                                              "crosscheck.json)")
    p.add_argument("--out", default="reports/latest", help="report folder (default reports/latest)")
    p.add_argument("--sweep", action="append", metavar="TABLE",
                   help="sweep or capacity table to include (engram sim sweep / capacity; repeatable)")
    p.add_argument("--trace", action="append", metavar="SOURCE",
                   help="trace source of the what-if curves (repeatable; default: the measured traces, else "
                        "Python source and prose from the standard library)")
    g = p.add_argument_group("capacity search of the report")
    g.add_argument("--target", type=float, default=CAPACITY_TARGET,
                   help=f"tokens/s every session must reach (default {CAPACITY_TARGET:g})")
    g.add_argument("--compute-ms", type=float,
                   help="compute per step, ms (default: the SPEC §8 reference, ~47 ms)")
    g.add_argument("--seeds", type=int, help=f"searches per device, each its own seeds (default {REPORT_SEEDS}; "
                                              "--quick 2)")
    g.add_argument("--max-sessions", type=int,
                   help=f"largest session count probed (default {REPORT_MAX_SESSIONS}; --quick 128)")
    p.add_argument("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
    p.add_argument("--title", help="report title")
    p.add_argument("--quick", action="store_true", help="shorter simulations, fewer points")
    p.add_argument("--no-html", action="store_true", help="Markdown only")
    p.add_argument("--linked-figures", action="store_true",
                   help="report.html links figures/ and data/ by relative path instead of embedding them")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars: plain progress lines on stderr instead")
    p.add_argument("--quiet", action="store_true", help="no progress output at all")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_typed_os_errors(_cmd_report))


# ------------------------------------------------------------------------ demo
@_typed_errors
def _cmd_demo(args) -> int:
    md = run_demo(args.out, workdir=args.workdir, scale=args.scale, texts=args.text, quick=args.quick,
                  steps=args.steps, rounds=args.rounds, jobs=args.jobs, html_page=not args.no_html,
                  fio=not args.no_fio, wait=args.wait and not args.no_wait, progress=not args.no_progress)
    html_path = md.with_suffix(".html")
    print(f"report: {md}" + (f"  (HTML: {html_path})" if html_path.exists() and not args.no_html else ""))
    return 0


def add_demo_command(subparsers) -> None:
    """Add ``engram demo``."""
    p = subparsers.add_parser("demo", help="the main job: build, trace, look up, measure, calibrate, cross-check, "
                                           "sweep, report",
                              description="Run the whole mission on this machine: build a model file in the real "
                                          "format (V4.1 Flash layout at a reduced scale), make traces from real "
                                          "text that ships with Python (or --text), run lookups and gated adds, "
                                          "the measured decode runs, the calibration, the cross-check and a small "
                                          "sweep, and write the report (default reports/demo/). Several minutes "
                                          "on 2 cores with an SSD (README states the measured time); the 4.4 GiB "
                                          "model file is written once and reused on later runs.")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default {DEFAULT_OUT})")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR,
                   help=f"work folder: model file, measurements, calibration (default {DEFAULT_WORKDIR})")
    p.add_argument("--text", action="append", metavar="FILE",
                   help="your own text (UTF-8 file, or .jsonl prompts) instead of the built-in texts; repeatable")
    p.add_argument("--scale", type=float, help="layout scale of the model file (default 0.02: 4.4 GiB; --quick 0.001)")
    p.add_argument("--steps", type=int, help="decode steps per measured run (default 200; --quick 40)")
    p.add_argument("--rounds", type=int, help="interleaved rounds of measurements (default 5; --quick 2)")
    p.add_argument("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
    p.add_argument("--quick", action="store_true", help="a small, fast run (smoke test, under a minute on 2 cores)")
    p.add_argument("--no-fio", action="store_true", help="skip fio's microbenchmarks even when fio is installed")
    p.add_argument("--wait", action="store_true",
                   help="wait for a quiet machine before each measurement (up to 2 minutes in all; default: never, "
                        "each run is predicted with the device of its own time window)")
    p.add_argument("--no-wait", action="store_true", help="never wait for a quiet machine (the default)")
    p.add_argument("--no-html", action="store_true", help="Markdown report only")
    p.add_argument("--no-progress", action="store_true", help="no step lines or progress bars")
    p.set_defaults(func=_cmd_demo)


# -------------------------------------------------------------------- register
def add_sim_command(subparsers) -> None:
    """Add ``engram sim`` with ``trace``, ``decode``, ``prefill``, ``device``, ``sweep``, ``capacity`` and ``serve``."""
    p = subparsers.add_parser("sim", help="simulate Engram reads: traces, decode and prefill predictions, studies",
                              description="A simpy model of Engram row reads (SPEC §9): build traces from real "
                                          "text, predict decode tokens/s and prefill stalls for a device model "
                                          "and a read policy, run what-if studies and capacity searches.")
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    sub.required = True
    _add_trace(sub)
    _add_decode(sub)
    _add_prefill(sub)
    _add_device(sub)
    _add_sweep(sub)
    _add_capacity(sub)
    _add_serve(sub)


def add_measure_command(subparsers) -> None:
    """Add ``engram measure``."""
    _add_measure(subparsers)


def add_calibrate_command(subparsers) -> None:
    """Add ``engram calibrate``."""
    _add_calibrate(subparsers)


def add_crosscheck_command(subparsers) -> None:
    """Add ``engram crosscheck``."""
    _add_crosscheck(subparsers)


def register(subparsers) -> None:
    """Add every simulator command to ``engram``'s subparsers (the entry points of ``setup.cfg`` add them
    one at a time)."""
    add_sim_command(subparsers)
    add_measure_command(subparsers)
    add_calibrate_command(subparsers)
    add_crosscheck_command(subparsers)
    add_report_command(subparsers)
    add_demo_command(subparsers)
