"""``engram sim sweep`` and ``engram sim capacity``: what-if studies over a grid, and the capacity of each
configuration searched (sessions at a tokens/s target, or requests/s of a serving study)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from engram.cli import print_json
from engram.errors import ArgumentError, EngramError
from engram.options import Command, Option, check_requires, replaced
from engram.rowcache import DEFAULT_POLICY

from sim.sweep.capacity import (CAPACITY_MAX_SESSIONS, CAPACITY_SEEDS, CAPACITY_TARGET, grid_capacities, phases_short,
                                phases_text, probes_path, run_capacity)
from sim.core.io import load_json
from sim.device.presets import assumed_figures, load_device
from ..serve import ServeStudy
from ..serve.search import probes_path as serve_probes_path
from ..serve.search import knee_words, run_serve_capacity
from ..serve.study import RateSearch, is_serve_study
from ..sweep import PHASES_COLUMN, Study, meta_path, partial_path, run_study
from ..sweep.runner import point_policy
from ..trace import CODE_SOURCE
from .decode import (CACHE_POLICY_OPTION, CACHE_WARMUP_OPTION, HOST_OPTIONS, SHARED_CACHE_BYTES_OPTION, cache_warmup,
                     check_host_flags)
from .options import (_DEFAULT_DEVICE, _floats, _out_path, _progress_mode, _typed_os_errors, compute_ms_option,
                      device_option, drives_option, run_options, trace_source_options)

#: The configuration a capacity of the command line shares with ``studies/capacity.toml``'s ``[fixed]`` table
#: (the SPEC §8 compute unless --compute-ms; threshold 8 and 16 readers; sessions at random phases); --trace,
#: --limit and --steps replace the first three.
PLANNER_FIXED = {"trace": CODE_SOURCE, "trace_limit": 1000, "steps": 300, "compute": "reference", "threshold": 8,
                 "readers": 16, "phases": "random"}

#: The options that describe configurations without a study file (dest -> flag).
_PLANNER_FLAGS = {"device": "--device", "drives": "--drives", "reuse": "--reuse", "compute_ms": "--compute-ms",
                  "trace": "--trace", "limit": "--limit", "steps": "--steps",
                  "shared_cache_bytes": "--shared-cache-bytes", "cache_policy": "--cache-policy",
                  "cache_warmup_steps": "--cache-warmup-steps", "host_cpus": "--host-cpus",
                  "host_step_us": "--host-step-us", "host_read_us": "--host-read-us",
                  "host_sessions": "--host-sessions"}


def device_assumed(specs) -> dict:
    """``{device spec: ["NAME = VALUE: RULE", ...]}``: the figures each device's model assumed, not measured nor
    given (its ``derived`` entries whose rule says "assumed"; :func:`sim.device.presets.load_device`), for every
    spec of ``specs`` that loads and has any -- a capacity on a datasheet rests on them (a latency spread of cv
    0.5 where no cv or p99 is given), and a fio file's measured spread does not."""
    out = {}
    for spec in dict.fromkeys(str(x) for x in specs):
        try:
            said = assumed_figures(load_device(spec))
        except EngramError:
            continue  # a calibrated device, or one the run already refused
        if said:
            out[spec] = said
    return out


def _runner_text(name: str) -> str:
    """Where the simulations ran, in words: ``processes:N`` (the runner's name) is the simulator's own N local
    worker processes, not the sessions' (``--host-sessions``)."""
    kind, _, n = str(name).partition(":")
    return f"{n} local worker processes of the simulator" if kind == "processes" and n else str(name)


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
    _refuse_an_earlier_default(args, out, None, "sweep")
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
    print(f"ran       {res.seconds:.1f} s on {_runner_text(res.runner)}"
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


#: Add ``sweep`` to the ``engram sim`` subcommands.
SWEEP_COMMAND = Command("sweep", "run a what-if study (a TOML grid) locally or on a Dask cluster",
                        run_options("results table"), _typed_os_errors(_cmd_sweep),
                        description="Run every point of a study file (a grid over device, policy, cache, sessions, "
                                    "compute and trace; see studies/*.toml) through the decode simulator, in parallel "
                                    "local processes or on a running Dask cluster, and write one row per point (CSV, "
                                    "or Parquet with pyarrow) as each finishes; TABLE.meta.json says whether the table"
                                    " is complete and which points are missing. Each point's seed derives from the "
                                    "study seed and the point, so every runner gives the same table. A point whose "
                                    "worker dies is run again (at most 3 times); an interrupted run keeps its rows and"
                                    " continues with --resume. Capacity studies (with a [capacity] table) run with "
                                    "engram sim capacity.")


def planner_study(args) -> Study:
    """The capacity study of the command line: a configuration per ``--device`` x ``--drives`` x ``--reuse``
    over :data:`PLANNER_FIXED`, with ``--compute-ms`` (else the SPEC §8 compute), ``--trace``, ``--limit``
    and ``--steps``, the host of ``--host-cpus`` (``--host-step-us``, ``--host-read-us``; study axes
    ``host_cpus``, ...: :mod:`sim.decode.host`), and a shared row cache of ``--shared-cache-bytes`` (``--cache-policy``), warmed before
    each probe by ``--cache-warmup-steps`` steps a session (default: the probes' steps); the search's target,
    seeds and largest count come from its own options.

    Raises
    ------
    ArgumentError
        A value out of range (names the axis and the value, as a study file's would); ``--cache-policy`` or
        ``--cache-warmup-steps`` without a cache (they would change nothing).
    """
    check_requires(CAPACITY_OPTIONS, args)
    fixed = dict(PLANNER_FIXED)
    if args.compute_ms is not None:
        fixed.update(compute="", compute_ms=args.compute_ms)
    for key, dest in (("trace", "trace"), ("trace_limit", "limit"), ("steps", "steps")):
        if getattr(args, dest) is not None:
            fixed[key] = getattr(args, dest)
    if args.shared_cache_bytes:  # 0: no cache, as for engram sim decode
        warm = cache_warmup(args)
        fixed.update(shared_cache_bytes=str(args.shared_cache_bytes), cache_policy=args.cache_policy or DEFAULT_POLICY,
                     cache_warmup_steps=fixed["steps"] if warm is None else warm)
    check_host_flags(args)  # each flag's range, naming it; the study's axes check the rest (check_host_axes)
    for key in ("host_cpus", "host_step_us", "host_read_us", "host_sessions"):
        if getattr(args, key) is not None:
            fixed[key] = getattr(args, key)
    grid = {"device": list(args.device or [_DEFAULT_DEVICE])}
    if args.drives:
        grid["drives"] = list(args.drives)
    if args.reuse:
        grid["reuse"] = list(args.reuse)
    return Study.from_dict({"study": {"name": "capacity", "seed": 0,
                                      "description": "capacity of the configurations of the command line"},
                            "capacity": {}, "fixed": fixed, "grid": grid}, source="the command line")


def _refuse_an_earlier_default(args, out: Path, probes: Optional[Path], what: str = "capacity search") -> None:
    """Without ``--out`` a sweep or a capacity search writes STUDY.csv (a capacity search without a study file:
    ``capacity.csv``) in the current directory: an earlier run's table, probes or unfinished rows there are
    refused in one line (naming the file, the ``--out`` that replaces it and the ``--resume`` that continues it)
    rather than overwritten.  An ``--out`` given says which file to write; ``--resume`` continues the table there.

    Raises
    ------
    ArgumentError
        The default table, its probes (``probes``; None: a sweep has none) or their unfinished rows exist.
    """
    if args.out or args.resume:
        return
    for p in (out, partial_path(out)) if probes is None else (out, probes, partial_path(probes)):
        if p.exists():
            again = f"--resume{'' if args.study else f' --out {out}'}"
            raise ArgumentError(f"{p} exists (an earlier {what}): give --out {out} to replace it, "
                                f"{again} to continue it, or another --out")


def _host(c) -> Optional[dict]:
    """The ``host`` of a configuration in ``engram sim capacity --json`` (None without one): the host every probe
    ran on (:meth:`sim.sweep.capacity.Capacity.host`; ``cpus``, ``step_cpu_us``, ``read_cpu_us``, ``spin_us``,
    ``source``: :meth:`sim.decode.host.HostCPU.to_dict`)."""
    h = c.host()
    return None if h is None else h.to_dict()


def _row_cache(c) -> Optional[dict]:
    """The ``row_cache`` of a configuration in ``engram sim capacity --json`` (None without one): its size, policy
    and warm-up (:attr:`sim.core.params.Policy.cache_warmup_steps`), the hit rate of the probe at the capacity,
    that probe's hit rate from the other start (``other_start``: :attr:`sim.sweep.capacity.Capacity.cache_other`)
    and the output's line (``note``)."""
    row = c.row()
    pol = point_policy({**c.config, "sessions": 1, "repeat": 0})
    if not (pol.shared_cache_rows or pol.cache_rows):
        return None
    return {"shared_cache_rows": pol.shared_cache_rows, "shared_cache_bytes": pol.shared_cache_bytes or None,
            "cache_rows": pol.cache_rows, "cache_policy": pol.cache_policy,
            "cache_warmup_steps": pol.cache_warmup_steps, "hit_rate_at_capacity": row["cache_hit_rate_at_capacity"],
            "other_start": ({"cache_warmup_steps": c.cache_other[0], "hit_rate": c.cache_other[1]}
                            if c.cache_other else None),
            "note": c.cache_note()}


def _bracket(c) -> Optional[list]:
    """``[low, high]`` of a capacity's bracket (:meth:`sim.sweep.capacity.Capacity.bracket`: the session counts the
    median seed's search left it between; ``high`` None for a pass at the largest count), None where unknown."""
    b = c.bracket()
    return None if b is None else list(b)


def _cmd_capacity(args) -> int:
    given = [flag for dest, flag in _PLANNER_FLAGS.items() if getattr(args, dest) is not None]
    if args.study is not None and given:
        raise ArgumentError(f"{given[0]} describes a configuration of the command line: give a study file or "
                            f"the options ({', '.join(_PLANNER_FLAGS.values())}), not both")
    if args.study is not None and is_serve_study(args.study):
        return _cmd_serve_capacity(args)
    for flag in ("min_rate", "max_rate", "rate_resolution"):
        if getattr(args, flag) is not None:
            raise ArgumentError(f"--{flag.replace('_', '-')} applies to serving studies ([serve] and [slo] tables)")
    if args.resume and args.study is None and not args.out:
        raise ArgumentError("--resume needs the --out of the run to continue")
    study = Study.load(args.study) if args.study is not None else planner_study(args)
    out = _out_path(args, study.name)
    _refuse_an_earlier_default(args, out, probes_path(out))
    try:
        res = run_capacity(study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                           progress=_progress_mode(args), out=out, resume=args.resume, target=args.target,
                           seeds=args.seeds, max_sessions=args.max_sessions, resolution=args.resolution,
                           sustained=args.sustained)
    except KeyboardInterrupt:
        return _interrupted(out, "capacity", probes_path(out))
    axes = [a for a in study.axes()]
    spec = res.spec
    assumed = device_assumed(c.config.get("device") for c in res.capacities if c.config.get("device"))
    if args.json:
        print_json({"table": str(res.table), "meta": str(meta_path(res.table)),
                    "probes": str(probes_path(res.table)), "capacity": spec.to_dict(), "seconds": res.seconds,
                    "runner": res.runner, "resumed_probes": res.resumed,
                    "configurations": [{**{a: c.config[a] for a in axes}, "capacity": c.capacity, "low": c.low,
                                        "high": c.high, "bracket": _bracket(c), "per_seed": c.per_seed,
                                        "lower_bound": c.lower_bound,
                                        "probes": len(c.probes), "phases": c.row()[PHASES_COLUMN],
                                        "compute_mean_ms": c.compute_ms,
                                        "compute_realised_mean_ms": c.compute_realised[0],
                                        "compute_realised_cv": c.compute_realised[1],
                                        "row_cache": _row_cache(c), "host": _host(c),
                                        "zero_capacity_reason": c.zero_note() or None,
                                        "warnings": c.warnings, "assumptions": c.assumptions(),
                                        "device_assumed": assumed.get(str(c.config.get("device")), [])}
                                       for c in res.capacities]})
        return 0
    print(f"study     {study.name}: {len(res.capacities)} configuration(s); the largest session count whose "
          f"slowest session reaches {spec.target:g} tokens/s, searched with {spec.seeds} "
          f"seed{'' if spec.seeds == 1 else 's'} up to "
          f"{spec.max_sessions} sessions" + (f" to within {spec.resolution} sessions (--resolution)"
                                            if spec.resolution > 1 else ""))
    print(f"ran       {res.seconds:.1f} s on {_runner_text(res.runner)}; "
          f"{sum(len(c.probes) for c in res.capacities)} probes"
          + (f" ({res.resumed} taken from the earlier run)" if res.resumed else ""))
    shared = {c.assumptions() for c in res.capacities}
    if len(shared) == 1:
        print(f"assumes   {shared.pop()}")
    for spec, said in assumed.items():
        print(f"device    {spec}: assumed, not measured: " + "; ".join(said))
    for c in res.capacities:
        what = ", ".join(f"{a}={c.config[a]}" for a in axes) or "the configuration"
        print(f"capacity  {what}: {c.label()}; {phases_short(c.phases)}")
        if c.zero_note():
            print(f"          why 0: {c.zero_note()}")
        if c.cache_note():
            print(f"          {c.cache_note()}")
        if len({x.assumptions() for x in res.capacities}) > 1:
            print(f"          assumes {c.assumptions()}")
    print(f"wrote     {res.table} (+ .meta.json, .probes.csv); plot it with: engram report --sweep {res.table}")
    return 0


_CONFIGS = ("configurations without a study file (as engram sim decode takes them; the rest as studies/capacity.toml: "
            "threshold 8, 16 readers, sessions at random phases)")
_SEARCH = "search (override the study's [capacity] table)"
_SERVING = "serving studies (override the study's [search] table)"
#: The search of a serving study whose [search] table leaves a value out.
_RATES = RateSearch()
#: The options of ``engram sim capacity``.
CAPACITY_OPTIONS = (
    *run_options("capacity table", study_optional=True),
    device_option(many=True, group=_CONFIGS),
    drives_option(many=True, group=_CONFIGS),
    Option("--reuse", type=_floats, metavar="R[,R...]", group=_CONFIGS,
           help="target reuse rates of the text, comma separated, each its own configuration: the trace "
                "becomes the synthetic trace of that rate (synth:reuse=R; default: the trace as it is)"),
    compute_ms_option("the SPEC §8 reference step, fitted so that threshold 256 gives 19.16 tokens/s on the reference "
                      "device", group=_CONFIGS),
    *trace_source_options(f"{CODE_SOURCE}, its first {PLANNER_FIXED['trace_limit']} tokens", group=_CONFIGS),
    Option("--steps", type=int, help=f"steps per session of each probe (default {PLANNER_FIXED['steps']})",
           group=_CONFIGS),
    *replaced((SHARED_CACHE_BYTES_OPTION,), group=_CONFIGS,
              help=SHARED_CACHE_BYTES_OPTION.help + "; default none; every probe runs it with the sessions it "
                   "probes, warmed first (--cache-warmup-steps), and the output gives its hit rate at the capacity"),
    *replaced((CACHE_POLICY_OPTION,), group=_CONFIGS, default=None, requires=("shared_cache_bytes", "SIZE")),
    *replaced((CACHE_WARMUP_OPTION,), group=_CONFIGS, default=None, requires=("shared_cache_bytes", "SIZE"),
              help=CACHE_WARMUP_OPTION.help.split(" (default")[0]
              + " (default: the probes' --steps; 0: it starts empty in each probe). A cache's hit rate changes with "
                "the steps it has seen until its policy settles (W-TinyLFU's counts over many steps), so a capacity "
                "with a cache depends on the probes' steps and warm-up: the output gives the hit rate of the probe at "
                "the capacity and that probe's from the other start; compare a longer warm-up"),
    *replaced(HOST_OPTIONS[:1], group=_CONFIGS,
              help=HOST_OPTIONS[0].help.replace("Default: the host left out (the drive alone)",
                                                "Default: the host left out (the drive alone: a capacity where the "
                                                "host's CPUs bind first is then an upper bound)")),
    *replaced(HOST_OPTIONS[1:], group=_CONFIGS, requires=("host_cpus", "N")),
    Option("--target", type=float, help=f"tokens/s every session must reach (default {CAPACITY_TARGET:g})",
           group=_SEARCH),
    Option("--seeds", type=int, help=f"searches per configuration, each its own seeds (default {CAPACITY_SEEDS})",
           group=_SEARCH),
    Option("--max-sessions", type=int, help=f"largest count probed (default {CAPACITY_MAX_SESSIONS})", group=_SEARCH),
    Option("--resolution", type=int, help="bisect until the bracket is this many sessions wide (default 1)",
           group=_SEARCH),
    Option("--sustained", action="store_true", default=None, group=_SEARCH,
           help="probe rate-limited volumes (cap_iops, burst_ios) with their bucket drained at the start of "
                "every probe: the sustained capacity, about cap_iops / (reads a step x target), instead of "
                "the burst's where the burst outlasts the probes (default: a full bucket)"),
    Option("--min-rate", type=float, group=_SERVING,
           help=f"requests/s probed first (default: the study's [search] min_rate, else {_RATES.min_rate:g})"),
    Option("--max-rate", type=float, group=_SERVING,
           help=f"the largest requests/s probed (default: the study's [search] max_rate, else {_RATES.max_rate:g})"),
    Option("--rate-resolution", type=float, group=_SERVING,
           help="bisect until the bracket is this share of its top (default: the study's [search] resolution, else "
                f"{_RATES.resolution:g})"),
)


#: Add ``capacity`` to the ``engram sim`` subcommands.
CAPACITY_COMMAND = Command("capacity", "search the sessions each configuration of a study sustains at a target",
                           CAPACITY_OPTIONS, _typed_os_errors(_cmd_capacity),
                           description="For every point of a capacity study (a study file with a [capacity] table; see"
                                       " studies/capacity.toml), find the largest number of concurrent sessions whose "
                                       "slowest session still decodes at the target tokens/s: probe 1 session, then only "
                                       "counts near the knee that queueing bounds on it bracket, and bisect (search = "
                                       "\"gallop\" in [capacity]: 1, 2, 4, ... until one fails, then bisect), once per "
                                       "seed of an "
                                       "ensemble; report "
                                       "the median with the smallest and largest capacity over the seeds, and every "
                                       "assumption (compute per step, batching, session phases, the target's headroom "
                                       "under the compute-only ceiling). Writes one row per configuration and every "
                                       "probe (STUDY.csv.probes.csv) as they finish; locally or on a Dask cluster like"
                                       " sweeps. A serving study (with [serve] and [slo] tables; see "
                                       "studies/serve.toml) is searched on the arrival rate instead: the most "
                                       "requests/s whose p99 TTFT and TBT meet the targets. Without a study file the "
                                       "configurations come from --device (repeatable), --drives, --reuse and "
                                       "--compute-ms, e.g. engram sim capacity --device ssd:qd1_us=80,iops=100000 "
                                       "--drives 1,2 --target 20. The progress line says the probes done and their "
                                       "session-steps, and the fewest probes still needed with their time at the rate "
                                       "measured so far (galloping: probes against the most it may still ask). Without"
                                       " --out, an earlier run's table in the current directory is refused, not "
                                       "replaced: --out names the file to replace, --resume continues it.")


def _cmd_serve_capacity(args) -> int:
    for flag in ("target", "max_sessions", "resolution", "sustained"):
        if getattr(args, flag) is not None:
            raise ArgumentError(f"--{flag.replace('_', '-')} applies to session capacity studies; a serving study "
                                "takes --min-rate, --max-rate, --rate-resolution")
    study = ServeStudy.load(args.study)
    out = _out_path(args)
    _refuse_an_earlier_default(args, out, serve_probes_path(out))
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
          f"{study.slo.text()}, searched with {sr.seeds} seed{'' if sr.seeds == 1 else 's'} from {sr.min_rate:g} up "
          f"to {sr.max_rate:g} requests/s (to {sr.resolution:.0%}), each probe measuring at least "
          f"{sr.min_requests} requests")
    print(f"ran       {res.seconds:.1f} s on {_runner_text(res.runner)}; "
          f"{sum(len(c.probes) for c in res.capacities)} probes"
          + (f" ({res.resumed} taken from the earlier run)" if res.resumed else ""))
    for c in res.capacities:
        what = ", ".join(f"{a}={c.config[a]}" for a in axes) or "the configuration"
        knee = knee_words(*c.knee())
        print(f"capacity  {what}: {c.label()}" + (f"; above it: {knee}" if knee else ""))
    print(f"wrote     {res.table} (+ .meta.json, .probes.csv)")
    return 0
