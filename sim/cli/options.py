"""What the simulator's commands share: option tables (:mod:`engram.options`), parsing of their values into
the simulator's objects, and the decorators that make a command's ordinary file failures typed errors."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, progress_choice
from engram.errors import ArgumentError, EngramError, TableIOError
from engram.options import Option, check_requires

from ..decode.speculative import DEFAULT_ACCEPTANCE, Speculation
from ..device import DEVICE_FORMS, load_device
from sim.core.io import OutputError, check_output_folder
from sim.core.limits import check_amount
from sim.core.params import (BACKENDS, COMPUTE_DISTS, CONSUMERS, DEFAULT_LAYERS, DEFAULT_PHASES, DEFAULT_READERS,
                             DEFAULT_THRESHOLD, Compute, Phases, Policy, consumer_preset)
from ..sweep.study import shipped_studies, study_file
from ..trace import CODE_SOURCE, load_trace


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


def _floats(text: str) -> list:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _trace(args):
    return load_trace(args.trace or CODE_SOURCE, limit=args.limit)


def trace_source_options(default_help: str, group=None) -> tuple:
    """``--trace`` and ``--limit`` (``default_help``: the default source, in words), in ``group``."""
    return (Option("--trace", metavar="SOURCE", group=group,
                   help="trace source: stdlib:PATH, package:PKG/PATH, shared:FILE, text:TEXT, tokens:FILE, "
                        f"or a .jsonl/.npz/.npy/text file (default {default_help})"),
            Option("--limit", type=int, help="keep the first N tokens of the trace", group=group))


_POLICY = "read policy (SPEC §8)"
#: The read policy of a prediction (:func:`_policy` reads it).
POLICY_OPTIONS = (
    Option("--threshold", type=int, default=DEFAULT_THRESHOLD, group=_POLICY,
           help=f"read concurrently from this many distinct rows a batch (default {DEFAULT_THRESHOLD})"),
    Option("--backend", choices=BACKENDS, default="pread", group=_POLICY,
           help="concurrent reads by a pread pool or an io_uring ring (default pread)"),
    Option("--readers", type=int, group=_POLICY,
           help="reads in flight of a concurrent batch, for either backend: pread threads or io_uring "
                f"queue depth, as in engram.Table and engram measure (default {DEFAULT_READERS})"),
    Option("--ring-depth", type=int, help="deprecated alias of --readers (io_uring only)", group=_POLICY),
    Option("--batch-overhead-us", type=float, default=0.0, group=_POLICY,
           help="microseconds added to every concurrent batch (default 0)"),
)


def device_option(many: bool = False, group=None) -> Option:
    """``--device``: the one device of a prediction (decode, prefill), or with ``many`` repeatable, each device
    a configuration of its own (capacity)."""
    forms = f"device: {DEVICE_FORMS}"
    if many:
        return Option("--device", action="append", metavar="SPEC", group=group,
                      help=f"{forms}; repeat for several, each its own configuration (default {_DEFAULT_DEVICE}; "
                           "see engram sim device)")
    return Option("--device", default=_DEFAULT_DEVICE, group=group,
                  help=f"{forms} (default {_DEFAULT_DEVICE}; see engram sim device)")


def drives_option(many: bool = False, group=None) -> Option:
    """``--drives``: one count (decode), or with ``many`` a comma-separated list, each a configuration."""
    what = "identical drives the tables are striped over by row id"
    if many:
        return Option("--drives", type=_ints, metavar="N[,N...]", group=group,
                      help=f"{what}, comma separated, each its own configuration (default 1)")
    return Option("--drives", type=int, default=1, help=f"{what} (default 1)", group=group)


def compute_ms_option(default: str = "", group=None, exclusive=None) -> Option:
    """``--compute-ms``: the mean compute of a step (``default``: what stands in without it, in words)."""
    return Option("--compute-ms", type=float, group=group, exclusive=exclusive,
                  help="mean compute time of a step, ms" + (f" (default: {default})" if default else ""))


#: What a prediction of one device takes beside its trace and policy (decode, prefill).
COMMON_OPTIONS = (
    device_option(),
    Option("--calibration", metavar="FILE",
           help="calibration file (engram calibrate) for --device calibrated or calibrated:BACKEND"),
    Option("--compute-dist", default="constant", choices=COMPUTE_DISTS,
           help="distribution of compute time, with the given mean and --compute-cv (default constant)"),
    Option("--compute-cv", type=float,
           help="coefficient of variation of compute (normal: at most 0.85; exponential: 1 by definition)"),
    Option("--layers", type=int, default=DEFAULT_LAYERS, help=f"decoder layers compute spreads over (default {DEFAULT_LAYERS})"),
    Option("--consumer", choices=tuple(CONSUMERS), default="none",
           help="Engram consumer added to each step's compute, both layers at batch 1: none (inside the "
                "compute, default), cpu (the host path, 16 cores) or h200 (the GPU path); see "
                "sim.core.params.CONSUMERS"),
    Option("--mode", choices=("fast", "exact"), default="fast",
           help="fast: batches of reads share the device as segments; exact: every read is an event "
                "(default fast)"),
    Option("--seed", type=int, default=0, help="random seed (default 0)"),
    Option("--bins", type=int, default=100, help="bins of the queue-depth timeline (default 100)"),
    JSON_OPTION,
)


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
    """The step compute of ``--compute-*``, plus ``--consumer``'s Engram layers at batch 1 (a session's own step)."""
    cv = 0.0 if args.compute_cv is None else args.compute_cv
    consumer = consumer_preset(getattr(args, "consumer", "none"))
    return Compute(mean + consumer.step_s(1), args.compute_dist, cv, (), args.layers)


#: What ``--draft-tokens`` and its companions mean, said once for ``engram sim decode`` and ``sim serve``.
SPECULATION_HELP = {
    "draft_tokens": "speculative decoding (DeepSeek V4 MTP): tokens drafted a step, k >= 0; each step verifies "
                    "k + 1 tokens in one forward pass, their rows read as one deduplicated batch, and emits 1 + the "
                    "accepted prefix; tokens/s counts emitted tokens (default 0: off). A verification step computes "
                    "as long as a one-token step (the compute model has no per-token term: decode reads the "
                    "weights once for all k + 1 tokens), plus --consumer's cost of the k extra tokens",
    "acceptance": "probability that a draft is right: one number in [0, 1], or a profile by draft position such "
                  f"as 0.8,0.6 (at most k values, the last repeated; default {DEFAULT_ACCEPTANCE:g})",
    "prefetch_drafts": "read the drafted tokens' rows in the background as soon as the previous step's rows "
                       "arrive, overlapping its compute; a verification step then waits only for what is not yet "
                       "read (rejected drafts' rows are read either way)",
}


_SPECULATION = "speculative decoding (sim.decode.speculative)"
#: ``--draft-tokens``, ``--acceptance`` and ``--prefetch-drafts`` of ``engram sim decode``
#: (:mod:`sim.decode.speculative`); the last two take effect only with drafts (:func:`_speculation`).
SPECULATION_OPTIONS = (
    Option("--draft-tokens", type=int, default=0, metavar="K", help=SPECULATION_HELP["draft_tokens"],
           group=_SPECULATION),
    Option("--acceptance", default=None, metavar="A[,A...]", group=_SPECULATION,
           help=SPECULATION_HELP["acceptance"] + " (only with --draft-tokens)", requires=("draft_tokens", "K (K >= 1)")),
    Option("--prefetch-drafts", action="store_true", group=_SPECULATION,
           help=SPECULATION_HELP["prefetch_drafts"] + " (only with --draft-tokens)",
           requires=("draft_tokens", "K (K >= 1)")),
)


def _speculation(args) -> Speculation:
    """The :class:`~sim.decode.speculative.Speculation` of the flags; ``--consumer``'s cost of the drafted
    tokens (its batch of k + 1 over its batch of 1) is what a verification step computes beyond a one-token
    step.

    Raises
    ------
    ArgumentError
        ``--draft-tokens`` below 0, an acceptance outside [0, 1] or NaN, a profile longer than k;
        ``--acceptance`` or ``--prefetch-drafts`` without drafts (they would change nothing).
    """
    check_requires(SPECULATION_OPTIONS, args)
    k = args.draft_tokens
    acceptance = str(DEFAULT_ACCEPTANCE) if args.acceptance is None else args.acceptance
    consumer = consumer_preset(getattr(args, "consumer", "none"))
    extra = consumer.step_s(k + 1) - consumer.step_s(1) if isinstance(k, int) and k > 0 else 0.0
    return Speculation(k, acceptance, args.prefetch_drafts, extra)


def _phases(args) -> Phases:
    if args.start_spread_ms is not None:
        if args.phases is not None:
            raise ArgumentError("give --phases or --start-spread-ms (deprecated: --phases spread:MS), not both")
        ms = check_amount(args.start_spread_ms, "--start-spread-ms", "ms")
        return Phases("spread", ms * 1e-3) if ms > 0 else Phases("lockstep")
    return Phases.parse(args.phases or DEFAULT_PHASES)


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


def _progress_mode(args) -> str:
    """The :mod:`sim.core.progress` mode of the progress flags (:func:`engram.cli.progress_choice`): ``--quiet``:
    nothing; ``--no-progress``: plain periodic lines, never a bar; else a bar on a terminal."""
    return progress_choice(args)


def study_arg(arg: str) -> str:
    """A study positional: the file, or the shipped study of that name (:func:`sim.sweep.study.study_file`)."""
    return str(study_file(arg))


#: The part of a study positional's help that says what it may name.
STUDY_HELP = ("a study TOML file, or the name of a study shipped with engram (" + ", ".join(shipped_studies())
              + "; studies/NAME.toml falls back to it where there is no such file)")


def run_options(what: str, study_optional: bool = False) -> tuple:
    """Options shared by ``sweep`` and ``capacity``: where and how the points run (``study_optional``: the
    study file may be left out, the configurations then given by options)."""
    study = (Option("study", nargs="?", type=study_arg, help=f"{STUDY_HELP} (optional: without one, the "
                                                              "configurations come from the options below)")
             if study_optional else Option("study", type=study_arg, help=STUDY_HELP))
    return (study,
            Option("--out", help=f"{what}, .csv or .parquet (default STUDY.csv in the current directory, where an "
                                 "earlier run's table is refused, not overwritten: name it with --out to replace it); "
                                 "rows are written as they finish"),
            Option("--resume", action="store_true",
                   help="continue an unfinished run: keep the finished rows of --out and run only the others"),
            Option("--jobs", type=int, help="local worker processes (default: CPU count; 1 = in this process)"),
            Option("--scheduler", metavar="ADDRESS",
                   help="run on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://10.0.0.5:8786)"),
            Option("--calibration", help="calibration.json for 'calibrated' devices and computes"),
            *PROGRESS_OPTIONS,
            JSON_OPTION)


def _out_path(args, name: str = "") -> Path:
    """``--out``, else STUDY.csv in the current directory (``name``.csv for a study of the command line);
    its folder must exist (:func:`sim.core.io.check_output_folder`)."""
    return check_output_folder(Path(args.out) if args.out else Path(f"{Path(args.study).stem if args.study else name}.csv"))


def _output_files(*paths) -> None:
    """Refuse, before any work, an output file (one of ``paths`` that is set) whose folder does not exist."""
    for p in paths:
        if p:
            check_output_folder(p)
