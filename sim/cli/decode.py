"""``engram sim decode``, ``prefill`` and ``device``: one prediction on one device model, and the model itself."""

from __future__ import annotations

import math
from typing import Optional

from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, print_json
from engram._checks import setting_number
from engram.errors import ArgumentError
from engram.options import Command, Exclusive, Option, replaced
from engram.rowcache import DEFAULT_POLICY, POLICIES, SIZE_RULE, size_arg

from ..decode import DecodeRun, fit_compute, reference_compute, simulate_decode
from ..device import DEVICE_FORMS, SEED_REFERENCE, load_device, preset_names
from sim.device.presets import assumed_figures
from sim.device.tail import load_tail
from sim.core.params import BACKENDS, Policy, Storage
from sim.core.limits import check_queue_depth
from sim.decode.host import MAX_CPUS, MAX_STEP_CPU_S, MIN_CPUS, SESSIONS, HostCPU
from sim.decode.prefill import PrefillRun, simulate_prefill
from .options import (COMMON_OPTIONS, POLICY_OPTIONS, SPECULATION_OPTIONS, _compute, _device, _ints, _output_files,
                      _phases, _policy, _progress_mode, _speculation, _trace, _typed_os_errors, compute_ms_option,
                      drives_option, trace_source_options)


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
    target = ref["serial_tokens_per_s"] if args.fit_tokens_per_s is None else args.fit_tokens_per_s
    if not (math.isfinite(target) and target > 0):
        raise ArgumentError(f"--fit-tokens-per-s must be a finite number > 0, got {args.fit_tokens_per_s}")
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


def _host(args, dev) -> Optional[HostCPU]:
    """The host of ``--host-cpus`` (None without it); ``--host-step-us`` / ``--host-read-us`` / ``--host-sessions``
    without it are refused."""
    if args.host_cpus is None:
        if args.host_step_us is not None or args.host_read_us is not None or args.host_sessions is not None:
            raise ArgumentError("--host-step-us, --host-read-us and --host-sessions go with --host-cpus N")
        return None
    check_host_flags(args)
    return HostCPU.for_device(args.host_cpus, dev, step_cpu_us=args.host_step_us, read_cpu_us=args.host_read_us,
                              sessions=args.host_sessions or "threads")


def check_host_flags(args) -> None:
    """``--host-cpus`` in [:data:`~sim.decode.host.MIN_CPUS`, :data:`~sim.decode.host.MAX_CPUS`] (both allowed),
    ``--host-step-us`` and ``--host-read-us`` in [0, 60 s] (microseconds), each where given: the host's own ranges
    (:class:`sim.decode.host.HostCPU`), checked here so that a refusal names the flag, not the dataclass's field.

    Raises
    ------
    ArgumentError
        ``"--host-cpus = 0.001: expected a finite number in [0.01, 65536]"``.
    """
    for flag, dest, lo, hi in (("--host-cpus", "host_cpus", MIN_CPUS, MAX_CPUS),
                               ("--host-step-us", "host_step_us", 0.0, MAX_STEP_CPU_S * 1e6),
                               ("--host-read-us", "host_read_us", 0.0, MAX_STEP_CPU_S * 1e6)):
        if getattr(args, dest, None) is not None:
            setting_number(flag, getattr(args, dest), lo, hi)


def _serves_text(dev, info: dict) -> str:
    """The ``serves`` line(s) of ``engram sim device``: the reads the fast mode serves at once, and why that
    differs from the device's parallelism when it does (a parametric SSD's channels)."""
    q, par = int(info["saturation_depth"]), int(dev.parallel_reads())
    out = f"{q} reads at once in the fast mode, the rest queued; peak {info['peak_iops']:.0f} IOPS"
    if q != par:
        knee = info.get("derived", {}).get("knee_qd", {}).get("value")
        out += (f"\n        {q}, not the parallelism {par}: the shallowest depth of the table"
                + (f" from the knee ({knee:g})" if knee is not None else "")
                + " at which the closed loop reaches its IOPS ceiling; with random service times the ceiling "
                  "is reached past the knee, not at it")
    return out


def _cmd_decode(args) -> int:
    tr = _trace(args)
    dev = _device(args)
    policy = _policy(args, cache_rows=args.cache_rows, overlap_layers=args.overlap_layers,
                     shared_cache_rows=args.shared_cache_rows, dram_fraction=args.dram_fraction,
                     shared_cache_bytes=args.shared_cache_bytes or 0, cache_policy=args.cache_policy,
                     cache_warmup_steps=cache_warmup(args))
    spec = _speculation(args)
    compute_s, fitted = _decode_compute(args, tr, dev, policy)
    r = simulate_decode(tr, dev, policy, _compute(args, compute_s),
                        DecodeRun(sessions=args.sessions, steps=args.steps, mode=args.mode, seed=args.seed,
                                  phases=_phases(args), bins=args.bins, progress=_progress_mode(args),
                                  host=_host(args, dev)),
                        storage=Storage(drives=args.drives, hot=args.dram_rows, tail=args.tail,
                                        calibration=args.calibration), speculation=spec)
    assumed = assumed_figures(dev, load_tail(args.tail, args.calibration, backend=policy.backend)
                              if args.tail is not None else None)
    if args.json:
        d = r.to_dict()
        d["fitted_compute"] = fitted
        d["device_assumed"] = assumed
        print_json(d)
        return 0
    if assumed:
        print(f"device    {args.device}: assumed, not measured: " + "; ".join(assumed))
    if fitted:
        kept = "" if fitted["refit"] or fitted["fitted_on"] == r.device["name"] else \
            f", kept for {r.device['name']} (compute belongs to the model, not the disk; --refit fits it here)"
        print(f"compute   {fitted['compute_ms']:.4f} ms a step, fitted on {fitted['fitted_on']} so that threshold "
              f"{fitted['threshold']} gives {fitted['tokens_per_s']} tokens/s{kept}")
    print(r.summary())
    return 0


_DECODE = "decode"
_COMPUTE = Exclusive("compute")
#: ``--shared-cache-bytes``: the row cache shared by the sessions, as the engine sizes it (``engram sim decode``;
#: ``engram sim capacity`` takes the same option, :data:`sim.cli.studies.CAPACITY_OPTIONS`).
SHARED_CACHE_BYTES_OPTION = Option(
    "--shared-cache-bytes", metavar="SIZE", type=size_arg, group=_DECODE,
    help="one row cache shared by the sessions, as the engine sizes it (engram.RowCache): SIZE // 264 rows (0: "
         f"none); SIZE is {SIZE_RULE}")
#: ``--cache-policy``: the row caches' replacement policy (decode; capacity).
CACHE_POLICY_OPTION = Option(
    "--cache-policy", choices=POLICIES, default=DEFAULT_POLICY, group=_DECODE,
    help=f"replacement policy of the row caches, the engine's code (default {DEFAULT_POLICY}, the "
         "engine's RowCache default)")
#: ``--cache-warmup-steps``: the caches' warm-up (:attr:`sim.core.params.Policy.cache_warmup_steps`; decode;
#: capacity, with another default).
CACHE_WARMUP_OPTION = Option(
    "--cache-warmup-steps", type=int, metavar="N", group=_DECODE, default=0,
    help="steps each session decodes through the row caches before the timed steps, neither timed nor counted: "
         "the N trace steps before its start, so that the caches are warm as a running server's (default 0: "
         "they start empty, as a fresh engine's; a measured run's cache starts empty too)")


#: ``--host-cpus``, ``--host-step-us``, ``--host-read-us``, ``--host-sessions``: the host's CPUs
#: (:mod:`sim.decode.host`; decode; capacity, as the study axes ``host_cpus``, ``host_step_us``, ``host_read_us``,
#: ``host_sessions``).
HOST_OPTIONS = (
    Option("--host-cpus", type=float, metavar="N", group=_DECODE,
           help="model the host: N CPUs shared by every session's steps (sim.decode.host, mean-value analysis) -- "
                "the engine's own CPU a step (its shipped profile) and each read's (a fio device's own CPU per "
                "read, else the profile's). Default: the host left out (the drive alone)"),
    Option("--host-step-us", type=float, metavar="US", group=_DECODE,
           help="with --host-cpus: the engine's own CPU a step, microseconds (default: its shipped profile)"),
    Option("--host-read-us", type=float, metavar="US", group=_DECODE,
           help="with --host-cpus: the CPU one read takes, microseconds (default: from the device's fio JSON, "
                "else the profile's)"),
    Option("--host-sessions", choices=SESSIONS, group=_DECODE,
           help="with --host-cpus: the sessions as threads of one process (one engine a device: the default) or "
                "as processes, each its own engine, whose step and reads take the profile's process_cpu_ratio "
                "times the CPU (1.28 on the 2-core VM with its CPUs busy, on any device)"),
)


def cache_warmup(args) -> int:
    """``--cache-warmup-steps`` (``ArgumentError`` naming it below 0)."""
    n = args.cache_warmup_steps
    if n is not None and n < 0:
        raise ArgumentError(f"--cache-warmup-steps must be >= 0, got {n}")
    return n
#: The options of ``engram sim decode``.
DECODE_OPTIONS = (
    *trace_source_options("stdlib:asyncio/base_events.py"),
    *COMMON_OPTIONS,
    *POLICY_OPTIONS,
    Option("--sessions", type=int, default=1, help="concurrent sessions sharing the device (default 1)", group=_DECODE),
    Option("--steps", type=int, group=_DECODE,
           help="steps per session (default: the trace length, with --draft-tokens the verification steps that "
                "cover it on average; longer runs replay the trace, with a warning)"),
    Option("--phases", metavar="random|lockstep|spread:MS", group=_DECODE,
           help="when sessions start: random (default; each at a random time within one step, seeded: "
                "independent sessions as a server sees them), lockstep (all at once: the worst case), "
                "spread:MS (session i at i x MS / sessions ms)"),
    Option("--start-spread-ms", type=float, help="deprecated: --phases spread:MS", group=_DECODE),
    Option("--cache-rows", type=int, default=0, group=_DECODE,
           help="per-session row cache in rows, policy --cache-policy (default 0)"),
    Option("--shared-cache-rows", type=int, default=0, group=_DECODE,
           help="one row cache shared by all sessions, rows (default 0)"),
    *replaced((SHARED_CACHE_BYTES_OPTION,), help=SHARED_CACHE_BYTES_OPTION.help + "; instead of --shared-cache-rows"),
    CACHE_POLICY_OPTION,
    CACHE_WARMUP_OPTION,
    Option("--dram-fraction", type=float, default=0.0, group=_DECODE,
           help="share of each table resident in DRAM, chosen by a hash of the row id (default 0)"),
    Option("--dram-rows", metavar="FILE.npy", group=_DECODE,
           help="a hot set resident in DRAM: row ids [m] (every table) or (table index, row id) [m, 2]"),
    drives_option(group=_DECODE),
    *HOST_OPTIONS,
    Option("--tail", metavar="DEVICE", group=_DECODE,
           help="take the latency distribution (tail) of this measured device at every depth, keeping "
                "--device's means (e.g. a fio JSON file or vm-virtio-16core-4k)"),
    Option("--overlap-layers", type=int, default=0, group=_DECODE,
           help="layers of compute before the second table's rows are needed (default 0: none; at most "
                "--layers)"),
    *SPECULATION_OPTIONS,
    compute_ms_option(group=_DECODE, exclusive=_COMPUTE),
    Option("--fit-tokens-per-s", type=float, group=_DECODE, exclusive=_COMPUTE,
           help="fit the compute so that --fit-threshold gives this rate on the reference device "
                "(a finite number > 0; default 19.16)"),
    Option("--fit-threshold", type=int, help="threshold of the fitting run (default 256)", group=_DECODE),
    Option("--refit", action="store_true", group=_DECODE,
           help="fit the compute on --device instead of the reference device (a slower disk then "
                "gets less compute: for reproducing a measured run, not for comparing devices)"),
    *PROGRESS_OPTIONS,
)


DECODE_COMMAND = Command("decode", "predict decode tokens/s (simpy model)",
                         DECODE_OPTIONS, _typed_os_errors(_cmd_decode),
                         description="Replay real token traces through a device model and a read policy and predict "
                                     "decode tokens/s, step latency percentiles and device utilisation (SPEC §9). "
                                     "Without --compute-ms the compute of a step is that of the SPEC §8 reference run "
                                     "-- fitted on the reference device so that threshold 256 gives 19.16 tokens/s -- "
                                     "and kept whatever --device: compute belongs to the model and its accelerator, "
                                     "not to the disk (--refit fits it on --device instead). Sessions start at random "
                                     "phases (--phases).")


def _cmd_prefill(args) -> int:
    if args.compute_tokens_per_s is not None:
        if not (math.isfinite(args.compute_tokens_per_s) and args.compute_tokens_per_s > 0):
            raise ArgumentError(f"--compute-tokens-per-s must be a finite number > 0, got {args.compute_tokens_per_s}")
        per_token = 1.0 / args.compute_tokens_per_s
    else:
        per_token = args.compute_us_per_token * 1e-6
    if args.trace is None:
        args.trace = "shared:agent_prompt_long.txt"
    tr = _trace(args)
    r = simulate_prefill(tr, _device(args), _policy(args), _compute(args, per_token),
                         PrefillRun(chunk=args.chunk, ubatch=args.ubatch, second_start_layer=args.second_start_layer,
                                    mode=args.mode, seed=args.seed, bins=args.bins, progress=_progress_mode(args)))
    if args.json:
        print_json(r.to_dict())
    else:
        print(r.summary())
    return 0


_PREFILL = "prefill"
_PREFILL_COMPUTE = Exclusive("compute", required=True)
#: The options of ``engram sim prefill``.
PREFILL_OPTIONS = (
    *trace_source_options("shared:agent_prompt_long.txt"),
    *COMMON_OPTIONS,
    *POLICY_OPTIONS,
    Option("--compute-tokens-per-s", type=float, help="prefill speed of compute alone, tokens/s", group=_PREFILL,
           exclusive=_PREFILL_COMPUTE),
    Option("--compute-us-per-token", type=float, help="compute per token through all layers, us", group=_PREFILL,
           exclusive=_PREFILL_COMPUTE),
    Option("--chunk", type=int, default=2048, help="tokens per reader chunk (default 2048)", group=_PREFILL),
    Option("--ubatch", type=int, help="tokens per compute micro-batch (default: --chunk)", group=_PREFILL),
    Option("--second-start-layer", type=int, default=2, group=_PREFILL,
           help="layer at which the second table's reader starts (default 2)"),
    *PROGRESS_OPTIONS,
)


PREFILL_COMMAND = Command("prefill", "predict prefill time and stalls of one prompt",
                          PREFILL_OPTIONS, _typed_os_errors(_cmd_prefill),
                          description="A prompt's rows are hashed, then streamed by one background reader per table in"
                                      " chunks; compute runs layer by layer and waits at an Engram layer until its "
                                      "chunk is read (SPEC §8). Predicts prefill time and stalls.")


def _cmd_device(args) -> int:
    _output_files(args.save)
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
        info["table"] = dev.table([check_queue_depth(q, "--qd") for q in args.qd])
    if args.json:
        info["saved"] = saved
        print_json(info)
        return 0
    print(f"device  {info['name']} ({info['kind']})")
    print(f"source  {info['source']}")
    for key, d in info.get("derived", {}).items():
        word = "assumed" if str(d["rule"]).startswith("assumed") else "derived"
        v = d["value"]
        print(f"{word} {key} = {v:g}: {d['rule']}" if isinstance(v, (int, float)) else f"{word} {key} = {v}: {d['rule']}")
    if "cap_iops" in info:
        raw = info["raw"]
        print(f"bucket  {info['cap_iops']:.0f} IOPS, {info['burst_ios']:g} reads deep, in front of {raw['name']} "
              f"({raw['kind']}, peak {raw['peak_iops']:.0f} IOPS): after a step's compute of c seconds "
              f"min({info['burst_ios']:g}, {info['cap_iops']:.0f} x c) reads pass at the raw device's latency")
    print(f"serves  {_serves_text(dev, info)}")
    raw_cols = bool(info["table"]) and "raw_mean_us" in info["table"][0]
    print(f"{'qd':>5} {'mean us':>10} {'p50 us':>10} {'p99 us':>10} {'IOPS':>10}"
          + (f" {'raw mean us':>12} {'raw IOPS':>10}" if raw_cols else ""))
    for r in info["table"]:
        print(f"{r['qd']:>5} {r['mean_us']:>10.1f} {r['p50_us']:>10.1f} {r['p99_us']:>10.1f} {r['iops']:>10.0f}"
              + (f" {r['raw_mean_us']:>12.1f} {r['raw_iops']:>10.0f}" if raw_cols else ""))
    if raw_cols:
        print("        (the long run of qd readers, each read at least qd / cap_iops; raw: the device behind the bucket)")
    if saved:
        print(f"saved   {saved}")
    return 0


#: The options of ``engram sim device``.
DEVICE_OPTIONS = (
    Option("name", nargs="?", help=DEVICE_FORMS),
    Option("--calibration", metavar="FILE", help="calibration file for the device 'calibrated'"),
    Option("--backend", choices=BACKENDS, default="pread",
           help="backend whose device to take from a calibration (default pread)"),
    Option("--qd", type=_ints, help="queue depths to show, comma separated"),
    Option("--save", help="write the model as JSON (reload with --device FILE.json)"),
    JSON_OPTION,
)


DEVICE_COMMAND = Command("device", "show or save a device model (latency and IOPS by queue depth)",
                         DEVICE_OPTIONS, _typed_os_errors(_cmd_device),
                         description="Print a device model's per-read latency and IOPS at each queue depth and what "
                                     "was derived from what was given and what was assumed; with no name, list the "
                                     "presets and the accepted forms. Every command reads devices the same way. A "
                                     "rate-limited volume (ssd:...,cap_iops=..,burst_ios=.., volume:..., or fio output"
                                     " recognised as one) shows its token bucket and the raw device behind it; fio "
                                     "output of another block size than the engine's 4 KiB is refused unless stated: "
                                     "fio:FILE.json,assume_bs=16k. fio output of a memory-backed device (tmpfs: a QD1 "
                                     "median below 15 us) is said to be one; fio:FILE.json,cpus=N scales it to the "
                                     "CPUs the readers will copy on (assumed, said). ssd:...,routing=random routes "
                                     "each read to a random channel (latency qd1_us + (N - 1) / iops at N in flight; "
                                     "the default is the first free channel).")
