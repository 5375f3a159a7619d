"""``engram sim ...``: the simulator on the command line.

``engram sim trace``    build a trace from real text, save it, print its reuse statistics
``engram sim decode``   predict decode tokens/s for a device, a read policy and a compute time
``engram sim prefill``  predict prefill time and stalls of one prompt
``engram sim device``   show (or save) a device model's latency and IOPS by queue depth
``engram measure``      measured decode runs of the real engine and its microbenchmarks
``engram calibrate``    fit the device and compute models from the microbenchmarks only
``engram crosscheck``   predicted vs measured decode runs, with the error table
``engram sim sweep``    a what-if study (TOML grid) in local processes or on a Dask cluster
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
import sys
from pathlib import Path

import numpy as np

from engram.cli import print_json
from engram.errors import ArgumentError

from .calibrate import calibrate_file
from .crosscheck import crosscheck_files, markdown_table
from .decode import fit_compute, reference_compute, simulate_decode
from .demo import DEFAULT_OUT, DEFAULT_WORKDIR, run_demo
from .device import DEVICE_FORMS, SEED_REFERENCE, load_device, preset_names
from .io import load_json
from .measure import (DEFAULT_DEPTHS, DEFAULT_SCALE, DEFAULT_TRACES, Settings, default_grid, ensure_model, grid,
                      measure, quick_grid)
from .params import (BACKENDS, COMPUTE_DISTS, DEFAULT_LAYERS, DEFAULT_PHASES, DEFAULT_READERS, DEFAULT_THRESHOLD,
                     Compute, Phases, Policy)
from .prefill import simulate_prefill
from .report import CAPACITY_SESSIONS, CAPACITY_TARGET, build_report
from .schema import RunConfig
from .sweep import run_study
from .trace import CODE_SOURCE, load_trace, reuse_stats

__all__ = ["add_calibrate_command", "add_crosscheck_command", "add_demo_command", "add_measure_command",
           "add_report_command", "add_sim_command", "register"]

_DEFAULT_DEVICE = "seed-apple-m3-ultra"


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
def _cmd_trace(args) -> int:
    tr = load_trace(args.source or CODE_SOURCE, limit=args.limit)
    out = None
    if args.out:
        out = str(tr.save(args.out))
    stats = reuse_stats(tr, args.lru or (), per_sequence=not args.one_session)
    if args.json:
        d = stats.to_dict()
        d["saved"] = out
        d["shape"] = list(tr.rows.shape)
        print_json(d)
        return 0
    print(f"trace     {tr.source}: {tr.steps} tokens, {stats.sequences} sequence(s), rows {list(tr.rows.shape)}")
    if out:
        print(f"saved     {out}")
    print(f"reuse     {stats.reuse_rate:.4f} of {stats.reads} row reads repeat an earlier (layer, row) "
          f"of the session")
    print("by order  " + "  ".join(f"{o}-gram {r:.4f}" for o, r in stats.by_order.items()))
    print("by layer  " + "  ".join(f"layer {lid} {r:.4f}" for lid, r in stats.by_layer.items()))
    for c, r in stats.lru.items():
        print(f"LRU       {c} rows: hit rate {r:.4f}")
    return 0


def _add_trace(sub) -> None:
    p = sub.add_parser("trace", help="build a trace from real text, save it, print reuse statistics",
                       description="Tokenize real text with the DeepSeek V4 tokenizer, hash it under the V4.1 "
                                   "layout into row ids per step [T, 2, 24], optionally save them (.npz), and "
                                   "print how often row reads repeat (by n-gram order and layer) and LRU hit rates.")
    p.add_argument("source", nargs="?",
                   help="trace source (default stdlib:asyncio/base_events.py): stdlib:PATH, package:PKG/PATH, "
                        "shared:FILE, text:TEXT, tokens:FILE, or a .jsonl/.npz/.npy/text file")
    p.add_argument("--limit", type=int, help="keep the first N tokens")
    p.add_argument("--out", help="save the trace to this .npz file")
    p.add_argument("--lru", type=_ints, help="LRU cache sizes in rows to report, comma separated")
    p.add_argument("--one-session", action="store_true",
                   help="treat all sequences of the trace as one session (default: each is its own)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_trace)


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
    p.set_defaults(func=_cmd_decode)


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
    p.set_defaults(func=_cmd_prefill)


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
    p.set_defaults(func=_cmd_device)


# --------------------------------------------------------------------- measure
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
    elif args.config:
        configs = []
    else:
        configs = default_grid(args.steps or 200, args.io_steps, args.mixer_steps)
    configs += [RunConfig.parse(t, steps) for t in args.config or ()]
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
                    max_background_iops=args.max_background_iops, wait_budget=args.wait_budget)


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
    for k in ("microbench", "runs"):
        if res[k]:
            print(f"wrote     {res[k]}")
    if res["runs"]:
        doc = load_json(res["runs"], "decode_runs")
        by = {}
        for r in doc["runs"]:
            by.setdefault(r["config"], []).append(r)
        print(f"{'configuration':<58} {'tokens/s':>9} {'spread':>7} {'p50 ms':>8} {'p95 ms':>8}")
        for key, rs in by.items():
            t = np.array([r["tokens_per_s"] for r in rs])
            sp = (t.max() - t.min()) / np.median(t) if t.size > 1 else 0.0
            print(f"{key:<58} {np.median(t):>9.1f} {sp * 100:>6.1f}% "
                  f"{np.median([r['step_ms']['p50'] for r in rs]):>8.3f} "
                  f"{np.median([r['step_ms']['p95'] for r in rs]):>8.3f}")
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
                                   "x 16. 7 interleaved rounds, every run on its own stretch of its trace.")
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
def _cmd_sweep(args) -> int:
    res = run_study(args.study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                    progress=not args.no_progress)
    out = Path(args.out) if args.out else Path(f"{Path(args.study).stem}.csv")
    path = res.write(out)
    if args.json:
        print_json({"table": str(path), "meta": str(path) + ".meta.json", "points": len(res.rows),
                    "seconds": res.seconds, "runner": res.runner, "axes": res.study.axes()})
        return 0
    axes = res.study.axes()
    print(f"study     {res.study.name}: {len(res.rows)} points over {', '.join(axes) or 'no varying axis'}")
    print(f"ran       {res.seconds:.1f} s on {res.runner}")
    best = max(res.rows, key=lambda r: r["session_tokens_per_s"])
    print("best      " + ", ".join(f"{a}={best[a]}" for a in axes) +
          f": {best['session_tokens_per_s']:.2f} tokens/s per session")
    print(f"wrote     {path} (+ .meta.json); plot it with: engram report --sweep {path}")
    return 0


def _add_sweep(sub) -> None:
    """Add ``sweep`` to the ``engram sim`` subcommands."""
    p = sub.add_parser("sweep", help="run a what-if study (a TOML grid) locally or on a Dask cluster",
                       description="Run every point of a study file (a grid over device, policy, cache, "
                                   "sessions, compute and trace; see studies/*.toml) through the decode "
                                   "simulator, in parallel local processes or on a running Dask cluster, and "
                                   "write one row per point (CSV, or Parquet with pyarrow). Each point's seed "
                                   "derives from the study seed and the point, so every runner gives the same "
                                   "table.")
    p.add_argument("study", help="study TOML file")
    p.add_argument("--out", help="results table, .csv or .parquet (default STUDY.csv in the current directory)")
    p.add_argument("--jobs", type=int, help="local worker processes (default: CPU count; 1 = in this process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://10.0.0.5:8786)")
    p.add_argument("--calibration", help="calibration.json for 'calibrated' devices and computes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_sweep)


# ---------------------------------------------------------------------- report
def _cmd_report(args) -> int:
    md = build_report(args.out, workdir=args.workdir, sweeps=args.sweep or (), traces=args.trace,
                      html_page=not args.no_html, target=args.target, compute_ms=args.compute_ms,
                      sessions=args.sessions or CAPACITY_SESSIONS, quick=args.quick, jobs=args.jobs,
                      title=args.title, progress=not args.no_progress and not args.json)
    figs = sorted(p.name for p in (md.parent / "figures").glob("*.png"))
    if args.json:
        print_json({"report": str(md), "html": str(md.with_suffix(".html")) if not args.no_html else None,
                    "figures": figs})
    else:
        print(f"report    {md}" + ("" if args.no_html else f"  (and {md.with_suffix('.html')})"))
        print(f"figures   {len(figs)} in {md.parent / 'figures'}; their numbers in {md.parent / 'data'}")
    return 0


def add_report_command(subparsers) -> None:
    """Add ``engram report``."""
    p = subparsers.add_parser("report", help="plotted report: measured, predicted, what-if (Markdown + PNG + HTML)",
                              description="Write a report folder (report.md, report.html, figures/*.png, "
                                          "data/*.csv, inputs/): the SPEC §8 seed reproduction, tokens/s by "
                                          "threshold, readers and row-cache size, step-latency CDFs, predicted vs "
                                          "measured with the error band, capacity (sessions a device sustains at "
                                          "a target tokens/s), and the figures of sweep tables. Give a folder of "
                                          "engram measure / calibrate (/ crosscheck) results for this machine's "
                                          "figures; without one, the figures use the device presets.")
    p.add_argument("workdir", nargs="?", help="measurement folder (microbench.json, runs.json, calibration.json, "
                                              "crosscheck.json)")
    p.add_argument("--out", default="reports/latest", help="report folder (default reports/latest)")
    p.add_argument("--sweep", action="append", metavar="TABLE", help="sweep table to plot (repeatable)")
    p.add_argument("--trace", action="append", metavar="SOURCE",
                   help="trace source of the what-if curves (repeatable; default: the measured traces, else "
                        "Python source and prose from the standard library)")
    p.add_argument("--target", type=float, default=CAPACITY_TARGET,
                   help=f"tokens/s per session of the capacity figure (default {CAPACITY_TARGET:g})")
    p.add_argument("--compute-ms", type=float,
                   help="compute per step of the capacity figure, ms (default: the SPEC §8 reference, ~47 ms)")
    p.add_argument("--sessions", type=_ints, help="session counts of the capacity figure (default 1,2,4,...,128)")
    p.add_argument("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
    p.add_argument("--title", help="report title")
    p.add_argument("--quick", action="store_true", help="shorter simulations, fewer points")
    p.add_argument("--no-html", action="store_true", help="Markdown only")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_report)


# ------------------------------------------------------------------------ demo
def _cmd_demo(args) -> int:
    md = run_demo(args.out, workdir=args.workdir, scale=args.scale, texts=args.text, quick=args.quick,
                  steps=args.steps, rounds=args.rounds, jobs=args.jobs, html_page=not args.no_html,
                  fio=not args.no_fio, wait=not args.no_wait, progress=not args.no_progress)
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
                                          "sweep, and write the report (default reports/demo/). About 3 minutes "
                                          "on 2 cores with an SSD; the 4.4 GiB model file is written once and "
                                          "reused on later runs.")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default {DEFAULT_OUT})")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR,
                   help=f"work folder: model file, measurements, calibration (default {DEFAULT_WORKDIR})")
    p.add_argument("--text", action="append", metavar="FILE",
                   help="your own text (UTF-8 file, or .jsonl prompts) instead of the built-in texts; repeatable")
    p.add_argument("--scale", type=float, help="layout scale of the model file (default 0.02: 4.4 GiB; --quick 0.001)")
    p.add_argument("--steps", type=int, help="decode steps per measured run (default 200; --quick 40)")
    p.add_argument("--rounds", type=int, help="interleaved rounds of measurements (default 5; --quick 2)")
    p.add_argument("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
    p.add_argument("--quick", action="store_true", help="a small, fast run (smoke test, about 20 seconds)")
    p.add_argument("--no-fio", action="store_true", help="skip fio's microbenchmarks even when fio is installed")
    p.add_argument("--no-wait", action="store_true",
                   help="never wait for a quiet machine before a measurement (default: wait up to 2 minutes in all)")
    p.add_argument("--no-html", action="store_true", help="Markdown report only")
    p.add_argument("--no-progress", action="store_true", help="no step lines or progress bars")
    p.set_defaults(func=_cmd_demo)


# -------------------------------------------------------------------- register
def add_sim_command(subparsers) -> None:
    """Add ``engram sim`` with ``trace``, ``decode``, ``prefill``, ``device`` and ``sweep``."""
    p = subparsers.add_parser("sim", help="simulate Engram reads: traces, decode and prefill predictions",
                              description="A simpy model of Engram row reads (SPEC §9): build traces from real "
                                          "text, predict decode tokens/s and prefill stalls for a device model "
                                          "and a read policy.")
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    sub.required = True
    _add_trace(sub)
    _add_decode(sub)
    _add_prefill(sub)
    _add_device(sub)
    _add_sweep(sub)


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
