"""``engram sim serve``: one serving configuration simulated, or the real engine's serving counterpart
measured and predicted."""

from __future__ import annotations

import math

from engram import EngramModel
from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, print_json
from engram.errors import ArgumentError
from engram.options import Command, Option, check_requires

from sim.core.params import CONSUMERS, DEFAULT_READERS, DEFAULT_THRESHOLD, Storage
from ..serve import SLO, ServeRun, ServeStudy, ServeText, simulate_serve
from ..serve.counterpart import counterpart_table, predict_counterpart
from ..serve.engine import GATES
from ..serve.measured import CounterpartReads, CounterpartRun, measure_counterpart
from ..serve.runner import point_objects, resolve_serve_context
from ..serve.study import CV_RULE, SERVE_AXES, check_serve_point, serve_point_seed
from ..serve.workload import ARRIVALS
from ..trace import CODE_SOURCE, load_trace
from .options import SPECULATION_HELP, STUDY_HELP, _progress_mode, _typed_os_errors, study_arg


def _serve_point(args) -> tuple:
    """(point, seed, SLO, calibration) of ``engram sim serve``: a study's point (``--point``) or the axes' defaults,
    then every axis flag given."""
    flags = {a: getattr(args, a) for a in SERVE_AXES if getattr(args, a, None) is not None}
    if "cv" in flags and not (math.isfinite(flags["cv"]) and flags["cv"] > 0):
        raise ArgumentError(f"--cv must be a finite number > 0 ({CV_RULE}), got {flags['cv']}")
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
    check_requires(SERVE_OPTIONS, args, p)  # drafts' settings without drafts (the study's or the flags') change nothing
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
    rec = measure_counterpart(args.counterpart, text.tokens, source=spec,
                              run=CounterpartRun(batch=batch, steps=steps, prompt_tokens=prompt),
                              reads=CounterpartReads(backend=args.backend or "pread",
                                                     readers=args.readers or DEFAULT_READERS,
                                                     threshold=args.threshold or DEFAULT_THRESHOLD))
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
    check_serve_point(p, "serve")
    point_objects(p)  # every value checked before the text is tokenized
    ctx = resolve_serve_context([p], slo, cal)
    o = point_objects(p, ctx)
    key_dev = next(iter(ctx.devices.values()))
    r = simulate_serve(o["workload"], key_dev, o["policy"], o["compute"], o["scheduler"], slo,
                       storage=Storage(drives=p["drives"]),
                       text=ServeText(requests_file=ctx.files.get(p["requests"]), rows=next(iter(ctx.rows.values()))),
                       run=ServeRun(seed=seed, warmup=p["warmup_s"], bins=args.bins, progress=_progress_mode(args),
                                    speculation=o["speculation"]))
    if args.json:
        d = r.to_dict()
        d["point"] = p
        print_json(d)
    else:
        print(r.summary())
    return 0


def _axis_options() -> tuple:
    """An option per axis of a serving study (:data:`sim.serve.study.SERVE_AXES`), with no default (a flag given
    overrides the study's point); ``--acceptance`` and ``--prefetch-drafts`` take effect only with drafts."""
    group = "axes (as in a serving study; default: the study's point, else the axis default)"
    choices = {"arrivals": ARRIVALS, "gate": GATES, "consumer": tuple(CONSUMERS), "prefetch_drafts": ("off", "on")}
    out = []
    ranges = {"cv": f"a finite number > 0, {CV_RULE}; used by --arrivals gamma"}
    for name, (typ, default, label) in SERVE_AXES.items():
        more = f"; {SPECULATION_HELP[name]}" if name in SPECULATION_HELP else ""
        more += f"; {ranges[name]}" if name in ranges else ""
        needs = ("draft_tokens", "K (K >= 1)") if name in ("acceptance", "prefetch_drafts") else ()
        out.append(Option(f"--{name.replace('_', '-')}", dest=name, type=typ, choices=choices.get(name), group=group,
                          help=f"{label} (default {default!r}){more}", requires=needs))
    return tuple(out)


_SLO = "latency targets (default: the study's [slo], else p99 TTFT <= 2 s, TBT <= 100 ms)"
#: The options of ``engram sim serve``.
SERVE_OPTIONS = (
    Option("study", nargs="?", type=study_arg, help=f"{STUDY_HELP} with [serve] and [slo] tables (optional)"),
    Option("--point", type=int, default=0, help="the study's point to run (default 0)"),
    *_axis_options(),
    Option("--ttft-s", type=float, help="time to first token target, seconds", group=_SLO),
    Option("--tbt-ms", type=float, help="time between tokens target, ms", group=_SLO),
    Option("--percentile", type=float, help="percentile both targets apply to (default 99)", group=_SLO),
    Option("--calibration", metavar="FILE", help="calibration file for --device calibrated"),
    Option("--seed", type=int, help="random seed (default: the study point's, else 0)"),
    Option("--bins", type=int, default=100, help="bins of the timeline (default 100)"),
    Option("--counterpart", metavar="MODEL.gguf",
           help="instead: measure the real engine on MODEL (8 requests decoding in one batched read a step "
                "while a 4,096-token prompt prefills in the background; the device probed first) and print "
                "the serving model's prediction of it beside the measurement (--trace is the text)"),
    JSON_OPTION,
    *PROGRESS_OPTIONS,
)


SERVE_COMMAND = Command("serve", "a serving what-if: requests arriving, prefilled and decoded in batches",
                        SERVE_OPTIONS, _typed_os_errors(_cmd_serve),
                        description="Simulate one serving configuration: requests arrive open-loop (Poisson, gamma or "
                                    "replayed), each prompt's rows stream from the device in 2048-token chunks while "
                                    "the engine computes prompt chunks and decodes the running requests in continuous "
                                    "batches, every step reading its batch's rows once across requests. Prints TTFT, "
                                    "time between tokens, TPOT and end-to-end percentiles, throughput, goodput under "
                                    "the SLOs, where a token's time goes, the device and Little's law. Every axis of a"
                                    " serving study is a flag; with STUDY.toml, --point picks one of its points and "
                                    "the flags override it. The compute of a step defaults to the SPEC §8 reference "
                                    "step (47.01 ms at batch 1) plus 2.137 ms a token (ds4's 468 tokens/s prefill on "
                                    "an M3 Ultra): --compute-scale for a faster accelerator, --compute-file for "
                                    "measured steps.")
