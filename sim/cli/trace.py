"""``engram sim trace``: build, synthesize and profile traces, and write their reads as fio I/O logs."""

from __future__ import annotations

import argparse
from pathlib import Path

from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, print_json
from engram.errors import ArgumentError
from engram.options import Command, Exclusive, Option, replaced
from engram.rowcache import POLICIES, SIZE_RULE, sizes_arg

from sim.core.params import DEFAULT_READERS
from ..trace import CODE_SOURCE, PROFILES, load_trace, measure_profile, order_targets, reuse_stats, synthesize
from ..trace.rowcache import OPTIMAL, cache_curve
from ..trace.iolog import DEFAULT_BLOCK, RELEASED_FILE, engine_block, model_tables, plan_reads, released_tables
from ..trace.shape import DEFAULT_PROFILE, PROFILE_WINDOW
from ..trace.sources import encoded_by_tokenizer
from ..trace.synth import DEFAULT_TOKENS
from ..trace.tokens import check_model_vocabulary
from .options import _ints, _output_files, _progress_mode, _typed_os_errors


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
    _output_files(args.out)
    tr = load_trace(args.source or CODE_SOURCE, limit=args.limit)
    saved = str(tr.save(args.out)) if args.out else None
    stats = reuse_stats(tr, args.lru or (), per_sequence=not args.one_session, progress=_progress_mode(args))
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


#: The options of ``engram sim trace [stats]`` (on the ``stats`` subcommand with ``default=SUPPRESS``, so that
#: its values add to those given before it).
TRACE_STATS_OPTIONS = (
    Option("--limit", type=int, help="keep the first N tokens"),
    Option("--out", help="save the trace to this .npz file"),
    Option("--lru", type=_ints, help="LRU cache sizes in rows to report, comma separated"),
    Option("--one-session", action="store_true",
           help="treat all sequences of the trace as one session (default: each is its own)"),
    Option("--steps", type=int, metavar="N",
           help="a planned run of N steps per session: say whether it wraps past the end of the trace"),
    Option("--sessions", type=int, metavar="S", default=1,
           help="sessions of the planned run (default 1; with --steps)"),
    JSON_OPTION,
    *PROGRESS_OPTIONS,
)


_SOURCE_HELP = ("trace source: stdlib:PATH, package:PKG/PATH, shared:FILE, "
                "text:TEXT, tokens:FILE, synth:reuse=R[,zipf=S,tokens=N,seed=K,profile=code|prose], "
                "or a .jsonl/.npz/.npy/text file")


def _cmd_trace_synth(args) -> int:
    _output_files(args.out)
    tr = synthesize(args.reuse, zipf=args.zipf, tokens=args.tokens, seed=args.seed, profile=args.profile)
    saved = str(tr.save(args.out)) if args.out else None
    stats = reuse_stats(tr, args.lru or (), progress=_progress_mode(args))
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
    prof = measure_profile(load_trace(args.source, limit=args.limit), window=args.window, progress=_progress_mode(args))
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


def _policies(text: str) -> list:
    """``--policies``: one or more of the engine's policies, comma separated; one given twice is kept once."""
    got = list(dict.fromkeys(x for x in (t.strip() for t in text.split(",")) if x))
    if not got:
        raise argparse.ArgumentTypeError(f"give at least one policy, comma separated: {', '.join(POLICIES)}")
    return got


def _mib(b: int) -> str:
    for unit, n in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return f"{b / n:g} {unit}"
    return f"{b} B"


def _cmd_trace_reuse(args) -> int:
    tr = load_trace(args.source, limit=args.limit)
    curve = cache_curve(tr, args.cache_bytes, args.policies, sessions=args.sessions, steps=args.steps,
                        optimal=not args.no_optimal, progress=_progress_mode(args))
    if args.json:
        print_json(curve.to_dict())
        return 0
    names = list(curve.policies) + ([] if args.no_optimal else [OPTIMAL])
    print(f"trace     {curve.source}: {curve.sessions} session(s) x {curve.steps} steps sharing one cache, "
          f"{curve.reads:,} row reads, {curve.distinct_rows:,} distinct rows")
    print(f"reuse     {curve.reuse_rate:.4f}: the hit rate of a cache that never evicts "
          f"({_mib(curve.distinct_rows * 264)} of rows)")
    print(f"{'cache':>12} {'rows':>12} " + " ".join(f"{n:>9}" for n in names))
    for pt in curve.points:
        print(f"{_mib(pt.bytes):>12} {pt.rows:>12,} " + " ".join(f"{pt.hit_rate[n]:>9.4f}" for n in names))
    for pt in curve.points:
        for n in names:
            lay = "  ".join(f"layer {k} {v:.4f}" for k, v in pt.by_layer[n].items())
            order = "  ".join(f"{k}-gram {v:.4f}" for k, v in pt.by_order[n].items())
            print(f"{_mib(pt.bytes):>12} {n:>9}: {lay};  {order}")
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
    _output_files(args.out)
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


#: The options of ``engram sim trace synth``.
TRACE_SYNTH_OPTIONS = (
    Option("--reuse", type=float, required=True, help="target reuse rate in [0, 1), e.g. 0.225"),
    Option("--zipf", type=float, help="exponent of the copy-distance law (default: the profile's, "
                                      f"code {PROFILES['code'].zipf:g}, prose {PROFILES['prose'].zipf:g})"),
    Option("--tokens", type=int, default=DEFAULT_TOKENS, help=f"steps (default {DEFAULT_TOKENS})"),
    Option("--seed", type=int, default=0, help="seed (default 0)"),
    Option("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE,
           help=f"per-order shape: code (coding-agent context) or prose (a novel) (default {DEFAULT_PROFILE})"),
    Option("--out", help="save the trace to this .npz file"),
    Option("--lru", type=_ints, help="LRU cache sizes in rows to report, comma separated"),
    JSON_OPTION,
    *PROGRESS_OPTIONS,
)
_LIMIT = Option("--limit", type=int, help="keep the first N tokens of the trace")
_STEPS = Option("--steps", type=int, help="steps per session (default the trace length; wraps around)")
#: The options of ``engram sim trace profile``.
TRACE_PROFILE_OPTIONS = (
    Option("source", help=_SOURCE_HELP),
    Option("--window", type=int, default=PROFILE_WINDOW, help=f"tokens per window (default {PROFILE_WINDOW})"),
    Option("--limit", type=int, help="keep the first N tokens"),
    JSON_OPTION,
    *PROGRESS_OPTIONS,
)
#: The options of ``engram sim trace reuse``.
TRACE_REUSE_OPTIONS = (
    Option("source", help=_SOURCE_HELP),
    Option("--cache-bytes", type=sizes_arg, required=True, metavar="SIZES",
           help=f"cache budgets, comma separated, e.g. 64M,1G,16G, each at least one row (264 bytes); a size given "
                f"twice (the same bytes) is replayed once; each {SIZE_RULE}"),
    Option("--policies", type=_policies, default=["lru", "tinylfu"], metavar="P,Q",
           help="the engine's policies to replay, one or more (default lru,tinylfu); one given twice is replayed "
                "once"),
    Option("--sessions", type=int, default=1, help="sessions sharing the cache (default 1)"),
    _STEPS,
    _LIMIT,
    Option("--no-optimal", action="store_true", help="leave out the optimal bound (Belady; slower than "
                                                     "the policies, about a microsecond a read)"),
    *PROGRESS_OPTIONS,
    JSON_OPTION,
)
_STEP_RATE = Exclusive("step rate")
#: The options of ``engram sim trace iolog``.
TRACE_IOLOG_OPTIONS = (
    Option("trace", help=_SOURCE_HELP),
    Option("--out", required=True, help="the .iolog file (with --sessions S: STEM.sK.iolog each)"),
    Option("--model", help="model file (GGUF, or one shard) whose table offsets and layout to use"),
    Option("--filename", default=RELEASED_FILE,
           help=f"file name written for the released layout's tables (default {RELEASED_FILE})"),
    Option("--block-size", help="read alignment in bytes, or 'auto' (with --model: the engine's alignment "
                                "for that file here); default auto with --model, else 4096"),
    _LIMIT,
    _STEPS,
    Option("--sessions", type=int, default=1,
           help="sessions, each its own log, started as the decode model starts them (default 1)"),
    Option("--step-ms", type=float, help="one step every this many ms (iolog version 3 timestamps)",
           exclusive=_STEP_RATE),
    Option("--tokens-per-s", type=float, help="one step every 1/R s (iolog version 3 timestamps)",
           exclusive=_STEP_RATE),
    Option("--iodepth", type=int, default=DEFAULT_READERS,
           help=f"queue depth in the suggested fio command (default {DEFAULT_READERS}, the engine's readers)"),
    JSON_OPTION,
)


TRACE_STATS_COMMAND = Command("stats", "reuse statistics of a trace source (the default: `engram sim trace SOURCE`)",
                              (Option("source", nargs="?", help=f"{_SOURCE_HELP} (default {CODE_SOURCE})"),
                               *replaced(TRACE_STATS_OPTIONS, default=argparse.SUPPRESS)), _typed_os_errors(_cmd_trace),
                              description="Build or load a trace and print its reuse statistics (see engram sim "
                                          "trace).")


TRACE_SYNTH_COMMAND = Command("synth", "a synthetic trace with a target reuse rate and Zipf skew",
                              TRACE_SYNTH_OPTIONS, _typed_os_errors(_cmd_trace_synth),
                              description="Synthesize a token stream whose hashed rows repeat at the target reuse rate"
                                          " (share of row reads that repeat an earlier (layer, row) of the trace), "
                                          "with the per-order shape measured on real text (--profile) and a Zipf law "
                                          "of how far back repeats copy from (--zipf); hash it with the real tokenizer"
                                          " map and layout. Any command loads it by its spec, e.g. "
                                          "synth:reuse=0.225,zipf=1.1,tokens=2000,seed=0.")


TRACE_PROFILE_COMMAND = Command("profile", "the per-order reuse shape of a text (what synth reproduces)",
                                TRACE_PROFILE_OPTIONS, _typed_os_errors(_cmd_trace_profile),
                                description="Measure a trace's reuse profile on windows of --window tokens: reuse by "
                                            "n-gram order, the match-level transition law, the copy-distance law.")


TRACE_REUSE_COMMAND = Command("reuse", "row cache hit rate against cache size: the engine's policies and the "
                                      "optimal bound, by layer and n-gram order",
                              TRACE_REUSE_OPTIONS, _typed_os_errors(_cmd_trace_reuse),
                              description="Replay a trace through the engine's row cache (engram.RowCache: the same "
                                          "policy code, a session's decode step one batch, looked up then its misses "
                                          "inserted) for each --cache-bytes, and print the hit rate of each policy "
                                          "beside Belady's optimal bound (with bypass), overall, by layer and by "
                                          "n-gram order. --sessions N: N sessions share the cache and the text, as the"
                                          " decode model runs them (session i starts at step i*T/N and wraps, steps "
                                          "interleaved), e.g. the sessions of one server reading one system prompt. "
                                          "Use it to size EngramModel.open(path, cache=RowCache(SIZE, POLICY)).")


TRACE_IOLOG_COMMAND = Command("iolog", "the exact reads of a trace as an I/O log that fio --read_iolog replays",
                              TRACE_IOLOG_OPTIONS, _typed_os_errors(_cmd_trace_iolog),
                              description="Plan the engine's reads of every decode step (per table: distinct rows, "
                                          "block-aligned spans, rows sharing or touching a block in one read) and "
                                          "write them as an fio iolog: version 2 (as fast as fio's queue depth allows)"
                                          " or, with --step-ms/--tokens-per-s, version 3 with one timestamp a step. "
                                          "Offsets are those of --model (its layout hashes the trace's tokens), else "
                                          "of the released V4.1 Flash file (SPEC §6); replay on a device with "
                                          "--replay_redirect.")


TRACE_COMMAND = Command("trace", "traces: build from real text or synthesize, reuse statistics, fio I/O logs",
                        TRACE_STATS_OPTIONS, _typed_os_errors(_cmd_trace), defaults={"source": None},
                        subcommands=(TRACE_STATS_COMMAND, TRACE_SYNTH_COMMAND, TRACE_PROFILE_COMMAND,
                                     TRACE_REUSE_COMMAND, TRACE_IOLOG_COMMAND),
                        dest="trace_command", metavar="[SUBCOMMAND] [SOURCE]", required=False,
                        subparsers_action=_DefaultSubcommand, default_subcommand="stats",
                        description="With a SOURCE (or none): tokenize real text with the DeepSeek V4 tokenizer, hash "
                                    "it under the V4.1 layout into row ids per step [T, 2, 24], optionally save them "
                                    "(.npz), and print how often row reads repeat (by n-gram order and layer), LRU hit"
                                    " rates, and whether a planned run (--steps, --sessions) wraps past its end. "
                                    "Subcommands: synth (a trace with a target reuse rate), profile (the per-order "
                                    "reuse shape of a text), iolog (the exact reads as an fio I/O log).")
