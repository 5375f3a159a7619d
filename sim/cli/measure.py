"""``engram measure``, ``engram calibrate`` and ``engram crosscheck``: the real engine timed, the models fitted
to its microbenchmarks, and every measured run predicted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, print_json
from engram.errors import ArgumentError
from engram.options import Command, Option
from engram.rowcache import DEFAULT_POLICY, POLICIES, SIZE_RULE, size_arg

from sim.check.calibrate import calibrate_file
from sim.check.crosscheck import crosscheck_files, markdown_table
from sim.core.io import load_json
from ..measure import (DEFAULT_DEPTHS, DEFAULT_SCALE, DEFAULT_TRACES, MEASURED_CAPACITY_TARGET, PROBES_MIN, Settings,
                       default_grid, ensure_model, grid, measure, quick_grid, session_grid)
from ..measure.devices import DevicePlan, check_rates, measure_devices
from sim.check.planner import PLANNER_NAME, markdown_table as planner_table, planner_crosscheck
from sim.core.params import BACKENDS
from ..decode.speculative import DEFAULT_ACCEPTANCE, Speculation
from sim.core.schema import SESSION_MODES, ComputeSpec, RunConfig
from .options import _ints, _output_files, _progress_mode, _strs, _typed_errors


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
    configs += _speculative_configs(args, configs)
    seen, unique = set(), []
    for c in configs:
        if c.key not in seen:
            seen.add(c.key)
            unique.append(c)
    return unique


def _speculative_configs(args, configs) -> list:
    """``--draft-tokens K``: each single-session configuration (the mixer's left out) again, decoding
    speculatively at ``--acceptance``, with prefetch off and/or on (``--prefetch-drafts``).

    Raises
    ------
    ArgumentError
        K below 0, an acceptance outside [0, 1] or NaN, no configuration to decode speculatively, a row
        cache at the same time (``--cache-bytes``).
    """
    k = args.draft_tokens
    if k is None or k == 0:
        return []
    if getattr(args, "cache_bytes", None):
        raise ArgumentError("--draft-tokens with --cache-bytes: speculative runs through a row cache are not "
                            "predicted by the cross-check (measure them in two measurements)")
    acc = Speculation(k, args.acceptance).acceptance  # k >= 0 and the acceptance in [0, 1], or ArgumentError
    if len(acc) != 1:
        raise ArgumentError(f"--acceptance {args.acceptance}: engram measure takes one acceptance rate, not a profile")
    prefetch = {"off": (False,), "on": (True,), "both": (False, True)}[args.prefetch_drafts]
    out = [replace(c, draft_tokens=k, acceptance=acc[0], prefetch_drafts=pf)
           for c in configs if not c.multi and not ComputeSpec.parse(c.compute).mixer for pf in prefetch]
    if not out:
        raise ArgumentError("--draft-tokens: no single-session configuration without the mixer to decode "
                            "speculatively")
    return out


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
                    capacity_target=args.capacity_target, probe_every=args.probe_every,
                    cache_bytes=args.cache_bytes or 0, cache_policy=args.cache_policy)


@_typed_errors
def _cmd_measure(args) -> int:
    work = Path(args.workdir)
    scale = args.scale if args.scale is not None else (0.001 if args.quick else DEFAULT_SCALE)
    configs = _measure_configs(args)
    settings = _measure_settings(args)  # checked before the model file is built
    settings.resolved_depths()
    if args.throttle_iops is not None and not args.throttle_iops:
        raise ArgumentError("--throttle-iops: no rate given (e.g. --throttle-iops 4000,15000); leave the flag out "
                            "to measure the disk alone")
    check_rates(args.throttle_iops or ())  # before the model file is built
    need_mixer = any(c.compute.startswith("mixer") for c in configs)
    model = Path(args.model) if args.model else work / f"model-s{scale:g}.gguf"
    ensure_model(model, scale, build=not args.no_build, progress=_progress_mode(args) == "auto",
                 projections=need_mixer or not args.quick)
    if args.throttle_iops or args.tmpfs:
        return _measure_devices(args, model, configs, settings, work)
    res = measure(model, configs, work, settings, progress=_progress_mode(args))
    res["model"] = str(model)
    if args.json:
        print_json(res)
        return 0
    _print_measured(res, model, args)
    return 0


def _measure_devices(args, model, configs, settings, work) -> int:
    """``engram measure --throttle-iops ... / --tmpfs``: the grid on every device, each said built or skipped."""
    say = (lambda line: None) if args.json else print
    plan = DevicePlan(throttles=args.throttle_iops or (), tmpfs=args.tmpfs, fio=not args.no_fio,
                      fio_seconds=args.device_fio_seconds or (0.5 if args.quick else 1.0))
    doc = measure_devices(model, configs, work, settings, devices=plan, progress=not args.no_progress, say=say)
    if args.json:
        print_json(doc)
        return 0
    for d in doc["devices"]:
        res = doc["results"].get(d["name"])
        if res is None:
            continue
        print(f"\n== device {d['name']} ({d['class']}) ==")
        _print_measured(res, model, args)
    built = [d["name"] for d in doc["devices"] if d.get("built")]
    print(f"\ndevices   built: {', '.join(built) or 'none'}"
          + "".join(f"; skipped {d['name']}: {d['reason']}" for d in doc["devices"] if not d.get("built")))
    print(f"wrote     {doc['path']}")
    return 0


def _print_measured(res: dict, model, args) -> None:
    """The text output of one measurement: what ran, the backends, warnings, files and the table."""
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
        by = {c["key"]: [] for c in doc.get("configs", [])}  # in the grid's order, not the shuffled runs'
        for r in doc["runs"]:
            by.setdefault(r["config"], []).append(r)
        by = {k: v for k, v in by.items() if v}
        print(f"{'configuration':<62} {'tokens/s':>9} {'spread':>7} {'slowest':>8} {'p50 ms':>8} {'p95 ms':>8} "
              f"{'threads':>7}")
        for key, rs in by.items():
            t = np.array([r["tokens_per_s"] for r in rs])
            sp = (t.max() - t.min()) / np.median(t) if t.size > 1 else 0.0
            slow = np.median([r.get("slowest_tokens_per_s", r["tokens_per_s"]) for r in rs])
            print(f"{key:<62} {np.median(t):>9.1f} {sp * 100:>6.1f}% {slow:>8.1f} "
                  f"{np.median([r['step_ms']['p50'] for r in rs]):>8.3f} "
                  f"{np.median([r['step_ms']['p95'] for r in rs]):>8.3f} {max(r.get('threads', 0) for r in rs):>7}")
        print(f"          {THREADS_MEANING}")
        cached = [r for r in doc["runs"] if r.get("row_cache")]
        if cached:
            err = max(abs(r["row_cache"]["hit_rate"] - r["row_cache"]["predicted_hit_rate"]) for r in cached)
            c = cached[0]["row_cache"]
            print(f"row cache {c['policy']} {c['bytes']:,} bytes ({c['rows']:,} rows): hit rate measured "
                  f"{np.median([r['row_cache']['hit_rate'] for r in cached]):.4f}, predicted on the same trace "
                  f"stretches {np.median([r['row_cache']['predicted_hit_rate'] for r in cached]):.4f} (median over "
                  f"{len(cached)} runs; largest difference {err * 100:.2f} points)")
        print(f"capacity  the largest session count whose slowest session reaches {args.capacity_target:g} tokens/s: "
              "engram crosscheck gives it, measured and predicted")


#: What the ``threads`` column of ``engram measure`` counts (its table header, ``--help`` and README).
THREADS_MEANING = ("threads: the OS threads of the measuring process at mid-run (Python's, the pread readers', "
                   "the hash's OpenMP ones), the largest over the repeats; with sessions as processes, summed over "
                   "their processes")


def _grid_counts(configs) -> str:
    """``"6 single-session + 4 multi-session configurations"`` of a grid."""
    multi = sum(1 for c in configs if c.multi)
    return f"{len(configs) - multi} single-session + {multi} multi-session configurations"


_MODEL = "model file"
_GRID = "grid (any axis given replaces the default grid by the product of the axes)"
_MEASUREMENT = "measurement"
_DEVICES = "devices to check against (sim.measure.devices; WORKDIR/devices.json lists them)"


#: The model file of ``engram measure``.
MEASURE_MODEL_OPTIONS = (
    Option("--model", help="model .gguf to read (built there when missing; default WORKDIR/model-sSCALE.gguf)",
           group=_MODEL),
    Option("--scale", type=float, help="layout scale of the model (default 0.02: two 2.03 GB tables; "
                                       "--quick 0.001)", group=_MODEL),
    Option("--no-build", action="store_true", help="fail instead of building a missing model file", group=_MODEL),
)
#: The grid of ``engram measure``.
MEASURE_GRID_OPTIONS = (
    Option("--traces", type=_strs, help="comma-separated trace sources (default: the 4 default traces)", group=_GRID),
    Option("--thresholds", type=_ints, help="thresholds (default 8,256)", group=_GRID),
    Option("--backends", type=_strs, help="pread and/or io_uring (default both)", group=_GRID),
    Option("--readers", type=_ints, help="readers = ring depths (default 4,16)", group=_GRID),
    Option("--computes", type=_strs, help="compute specs (default none)", group=_GRID),
    Option("--config", action="append", metavar="TRACE/THRESHOLD/BACKEND/READERS[/COMPUTE[/STEPS]]",
           help="an extra configuration (repeatable)", group=_GRID),
    Option("--sessions", type=_ints, metavar="N,N,...",
           help="also run N concurrent decode sessions on the first trace, each on its own stretch, "
                "threshold 8, pread x 4, compute sleep:5 (e.g. 1,2,4,8,16,32; the default grid has them)", group=_GRID),
    Option("--modes", type=_strs, help="sessions as threads of one process and/or processes sharing the "
                                       "device (default threads,processes)", group=_GRID),
    Option("--session-steps", type=int, help="steps of each session (default --steps)", group=_GRID),
    Option("--capacity-target", type=float, default=MEASURED_CAPACITY_TARGET,
           help=f"tokens/s the slowest session must reach to count in the capacity (default "
                f"{MEASURED_CAPACITY_TARGET:g})", group=_GRID),
    Option("--steps", type=int, help="decode steps per run (default 200; --quick 60)", group=_GRID),
    Option("--io-steps", type=int, default=800,
           help="steps of the default grid's runs without compute (default 800)", group=_GRID),
    Option("--mixer-steps", type=int, default=30, help="steps of the default grid's mixer runs (default 30)",
           group=_GRID),
    Option("--draft-tokens", type=int, metavar="K",
           help="also run every single-session configuration (the mixer's left out) decoding "
                "speculatively: K drafts a step, each the replayed text's true next token with probability "
                "--acceptance, else a random id; a step reads its tokens with Session.step_many and rolls "
                "back the rejected drafts (Session.rollback); --steps then counts the tokens emitted; no "
                "probe steps (the cross-check predicts these runs with the calibrated device alone)", group=_GRID),
    Option("--acceptance", default=str(DEFAULT_ACCEPTANCE), metavar="A",
           help=f"probability a draft is the true next token, in [0, 1] (default {DEFAULT_ACCEPTANCE:g})", group=_GRID),
    Option("--prefetch-drafts", choices=("off", "on", "both"), default="both",
           help="read the next drafts' rows in the background (Session.prefetch) while a step computes: "
                "off, on, or each configuration both ways (default both)", group=_GRID),
)
#: The devices ``engram measure`` checks against.
MEASURE_DEVICES_OPTIONS = (
    Option("--throttle-iops", type=_ints, metavar="N[,M...]",
           help="also measure the grid inside a cgroup throttling the table's disk to N read IOPS (cgroup v1 "
                "blkio.throttle.read_iops_device or v2 io.max; the process and its session workers moved "
                "in, the cgroup removed after, also on Ctrl-C), one per rate, in WORKDIR/devices/throttle-N/; "
                "skipped with the reason where the kernel allows no throttle (not root, no blkio/io "
                "controller, the file on no block device); a rate the kernel refuses is an error", group=_DEVICES),
    Option("--tmpfs", action="store_true",
           help="also measure the grid on a copy of the model file on tmpfs read with O_DIRECT "
                "(WORKDIR/devices/tmpfs/; skipped with the reason where O_DIRECT fails there)", group=_DEVICES),
    Option("--device-fio-seconds", type=float,
           help="seconds of each fio depth (1..64) run on every device at the engine's read size and at "
                "4 KiB, saved as WORKDIR/.../fio-BYTES.json (default 1; --quick 0.5)", group=_DEVICES),
)


def measure_options(quick: str) -> tuple:
    """The options of ``engram measure`` (``quick``: what ``--quick`` runs, in words)."""
    return (
        Option("workdir", help="directory for the results (and the model file unless --model)"),
        *MEASURE_MODEL_OPTIONS,
        *MEASURE_GRID_OPTIONS,
        Option("--rounds", type=int, help="interleaved rounds: repeats of every run (default 7; --quick 2)",
               group=_MEASUREMENT),
        Option("--depths", type=_ints, help="queue depths of the I/O microbenchmarks (default 1,2,4,8,16,32,64)",
               group=_MEASUREMENT),
        Option("--io-batches", type=int, help="48-row batches per microbenchmark chunk (default 150)", group=_MEASUREMENT),
        Option("--io-chunks", type=int,
               help="chunks a round of 48-row batches where runs without compute read (default 8; --quick 2)",
               group=_MEASUREMENT),
        Option("--probe-every", type=int, default=Settings.probe_every, metavar="K",
               help="a probe step (a random token id through the run's own sessions) before every K-th step "
                    "of a decode run and after its last: the device and compute of the run's own time window "
                    f"(default {Settings.probe_every}; closer in a run shorter than {PROBES_MIN} K steps, so "
                    f"that it has {PROBES_MIN}; 0: none)", group=_MEASUREMENT),
        Option("--cache-bytes", metavar="SIZE", type=size_arg,
               help=f"decode runs read through a row cache of this budget (engram.RowCache; {SIZE_RULE}): a fresh "
                    "cache each run, filled by its trace steps (warm-up and probe steps go past it); runs.json "
                    "records its hit rate beside the one predicted on the same trace stretch, and engram "
                    "crosscheck predicts the runs' tokens/s from their misses (default: none; 0: none)",
               group=_MEASUREMENT),
        Option("--cache-policy", choices=POLICIES, default=DEFAULT_POLICY,
               help=f"the row cache's policy (default {DEFAULT_POLICY}, the engine's)", group=_MEASUREMENT),
        Option("--no-fio", action="store_true", help="skip fio even when installed", group=_MEASUREMENT),
        Option("--fio-seconds", type=float, help="seconds per fio depth (default 0.5)", group=_MEASUREMENT),
        Option("--only", choices=("micro", "runs"), help="only the microbenchmarks or only the decode runs",
               group=_MEASUREMENT),
        Option("--max-background", type=float, default=0.25, metavar="SHARE",
               help="wait before each task until other processes use at most this share of all CPUs (and "
                    "--max-background-iops), and redo a task when they used more during it (default 0.25)",
               group=_MEASUREMENT),
        Option("--max-background-iops", type=float, default=1000.0,
               help="disk requests a second by others on the model's device tolerated (default 1000)", group=_MEASUREMENT),
        Option("--wait-budget", type=float, default=120.0,
               help="seconds of waiting for a quiet machine in all, then measure regardless (default 120)",
               group=_MEASUREMENT),
        Option("--no-wait", action="store_true", help="never wait or redo (background load is still recorded)",
               group=_MEASUREMENT),
        Option("--quick", action="store_true",
               help=f"small and fast: {quick} x 60 steps, 2 rounds, depths 1,4,16, short "
                    "microbenchmarks, a scale-0.001 model, no waiting for a quiet machine", group=_MEASUREMENT),
        Option("--seed", type=int, default=0, help="seed of row ids, orders and residuals (default 0)", group=_MEASUREMENT),
        *MEASURE_DEVICES_OPTIONS,
        *PROGRESS_OPTIONS,
        JSON_OPTION,
    )


def measure_command() -> Command:
    """``engram measure`` (its help names the default and quick grids' sizes, counted from the grids)."""
    quick = _grid_counts(quick_grid())
    full = _grid_counts(default_grid())
    return Command("measure", "measure real decode runs and the engine's microbenchmarks",
                   measure_options(quick), _cmd_measure,
                   description="Run the real decode loop (hash -> one concurrent batch of 48 rows from a model "
                               "file in the real format -> decode -> projection + gated add as the step's "
                               "compute) over real traces, for a grid of thresholds x readers x backends x "
                               "traces x compute, recording per step the read, compute and step time; and the "
                               "microbenchmarks the calibration uses (the engine's reads by queue depth, fio "
                               "by iodepth when installed, the step's compute, the hash). Writes "
                               "WORKDIR/microbench.json, WORKDIR/runs.json and WORKDIR/traces/. The model's "
                               "other layers do not exist here: add an emulated load per step with a compute "
                               "spec (spin:MS, sleep:MS, blas:N; mixer = the Engram projection + gated add; "
                               f"join with +). Default grid ({full}): compute spin:2 on the "
                               "Italian novel, the agent prompt and Python source x {serial (threshold 256), "
                               "threshold 8 x pread/io_uring x 4/16 readers}; no compute (800 steps) on the "
                               "novel and the agent prompt x the same 5 policies; spin:2 on the 100 short "
                               "prompts, serial and io_uring x 16; the mixer on the novel, serial and io_uring "
                               "x 16; and 1, 2, 4, 8, 16, 32 concurrent decode sessions (threads of one process; "
                               "2 to 32 as "
                               "processes sharing the device) on the novel, each session on its own stretch, "
                               "pread x 4, compute sleep:5 (a step's accelerator work, no CPU of this machine), "
                               "recording every session's tokens/s, step latency, start offset and the threads "
                               "used. 7 interleaved rounds, every run on its own stretch of its trace, with "
                               "probe steps (random token ids through the same sessions) interleaved. Only the "
                               "read backends that start here are measured; the others are named with the "
                               f"reason. The table printed at the end: tokens/s (median over the repeats), "
                               f"their spread, the slowest session's tokens/s, step p50/p95, and "
                               f"{THREADS_MEANING}.")


@_typed_errors
def _cmd_calibrate(args) -> int:
    work = Path(args.workdir)
    micro = Path(args.microbench) if args.microbench else work / "microbench.json"
    out = Path(args.out) if args.out else work / "calibration.json"
    _output_files(out)
    cal = calibrate_file(micro, out, seed=args.seed)
    if args.json:
        d = cal.to_dict()
        d["saved"] = str(out)
        print_json(d)
        return 0
    print(cal.summary())
    print(f"saved        {out}")
    return 0


#: The options of ``engram calibrate``.
CALIBRATE_OPTIONS = (
    Option("workdir", help="directory of engram measure's results"),
    Option("--microbench", help="microbenchmark file (default WORKDIR/microbench.json)"),
    Option("--out", help="calibration file (default WORKDIR/calibration.json)"),
    Option("--seed", type=int, default=0, help="seed of the diagnostic makespan sampling (default 0)"),
    JSON_OPTION,
)


CALIBRATE_COMMAND = Command("calibrate", "fit the simulator's device and compute models from microbenchmarks",
                            CALIBRATE_OPTIONS, _cmd_calibrate,
                            description="Fit the device model (per backend: 48-row batch service time by readers, read"
                                        " latency by queue depth) and the compute model (measured step compute, "
                                        "resampled) from WORKDIR/microbench.json only; decode runs are refused. Writes"
                                        " WORKDIR/calibration.json (machine, file, date, fitted parameters).")


@_typed_errors
def _cmd_crosscheck(args) -> int:
    work = Path(args.workdir)
    if args.planner:
        out = Path(args.out) if args.out else work / PLANNER_NAME
        res = planner_crosscheck(work, out, fio=args.fio or (), sim_steps=args.sim_steps, seed=args.seed,
                                 progress=not args.no_progress, today=args.with_today, host=not args.no_host)
        if args.json:
            print_json(dict(res, saved=str(out)))
        else:
            print(planner_table(res))
            print(f"\nsaved {out}")
        return 1 if args.strict and not all(m.get("summary", {}).get("passed") for e in res["devices"]
                                            for m in e["modes"].values()) else 0
    if args.fio:
        raise ArgumentError("--fio DEVICE=FILE belongs to --planner")
    if args.no_host:
        raise ArgumentError("--no-host belongs to --planner")
    cal = Path(args.calibration) if args.calibration else work / "calibration.json"
    runs = Path(args.runs) if args.runs else work / "runs.json"
    out = Path(args.out) if args.out else work / "crosscheck.json"
    _output_files(out)
    res = crosscheck_files(cal, runs, out, sim_steps=args.sim_steps, seed=args.seed, progress=_progress_mode(args))
    if args.json:
        res["saved"] = str(out)
        print_json(res)
    else:
        print(markdown_table(res))
        print(f"\nsaved {out}")
    return 1 if args.strict and not res["summary"]["passed"] else 0


#: The options of ``engram crosscheck``.
CROSSCHECK_OPTIONS = (
    Option("workdir", help="directory of engram measure's and engram calibrate's results"),
    Option("--calibration", help="calibration file (default WORKDIR/calibration.json)"),
    Option("--runs", help="decode runs file (default WORKDIR/runs.json)"),
    Option("--out", help="output file (default WORKDIR/crosscheck.json)"),
    Option("--sim-steps", type=int, help="simulated steps per configuration (default max(steps, 2000))"),
    Option("--seed", type=int, default=0, help="simulator seed (default 0)"),
    Option("--strict", action="store_true", help="exit 1 when the verdict is FAIL (a goal of the regime the "
                                                  "runs ran in is missed)"),
    Option("--planner", action="store_true",
           help="planner mode (sim.check.planner): predict every run of every device of WORKDIR/devices.json "
                "(engram measure --throttle-iops/--tmpfs) from the device's fio JSON and from a datasheet "
                "string derived from it only -- no microbenchmark, no probes; compute as its spec states "
                "it -- with the same regimes and intervals; per device class median and max |error| of "
                "tokens/s and the capacity, next to today's cross-check where the device has one. Writes "
                "WORKDIR/planner.json"),
    Option("--with-today", action="store_true",
           help="with --planner: first calibrate and cross-check (today's way, probes and all) every device "
                "folder that has no crosscheck.json, to show beside the planner's figures"),
    Option("--no-host", action="store_true",
           help="with --planner: leave the host's CPUs out (the drive alone). By default the runs' machine's CPUs "
                "are shared by every session's steps (sim.decode.host: the engine's own CPU a step from its "
                "shipped profile, a read's CPU from fio's own figures), said in each mode's host_model"),
    Option("--fio", action="append", metavar="DEVICE=FILE",
           help="with --planner: a fio JSON file of your own for a device (random reads at the engine's "
                "read size; writes or another block size are refused)"),
    *PROGRESS_OPTIONS,
    JSON_OPTION,
)


CROSSCHECK_COMMAND = Command("crosscheck", "predict every measured run with the calibrated simulator; error table",
                             CROSSCHECK_OPTIONS, _cmd_crosscheck,
                             description="Replay each measured run's stretch of trace through the simulator with the "
                                         "calibrated device and compute, scaled to the run's own time window (its "
                                         "interleaved probe steps), and compare predicted with measured tokens/s and "
                                         "step p50/p95: each run against its own prediction, the median over a "
                                         "configuration's runs, with a 90% interval, next to the spread of the "
                                         "repeats. The regime comes from the background load measured during the runs "
                                         "and sets the goals: quiet (others under 10% of the CPUs): tokens/s median "
                                         "|error| <= 3%, max <= 8%, step p50 max <= 10%; busy (others at most a "
                                         "third): <= 5%, <= 10%, <= 10% and >= 90% of the configurations inside their "
                                         "interval; loaded: the interval coverage (the errors are shown, not held). In"
                                         " every regime measured and predicted capacity within one grid step. Writes "
                                         "WORKDIR/crosscheck.json.")
