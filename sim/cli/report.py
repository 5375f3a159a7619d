"""``engram report`` and ``engram demo``: the plotted report, and the main job that ends in it."""

from __future__ import annotations

import sys

from engram.cli import JSON_OPTION, PROGRESS_OPTIONS, print_json
from engram.errors import ArgumentError
from engram.options import Command, Option, add_command

from sim.sweep.capacity import CAPACITY_TARGET
from sim.cli.demo import DEFAULT_OUT, DEFAULT_WORKDIR, DEMO_THROTTLES, DemoMeasurement, DemoSize, run_demo
from ..report import REPORT_MAX_SESSIONS, REPORT_SEEDS, ReportPage, ReportSearch, build_report
from .options import _ints, _progress_mode, _typed_errors, _typed_os_errors


def _cmd_report(args) -> int:
    try:
        search = ReportSearch(target=args.target, compute_ms=args.compute_ms, seeds=args.seeds,
                              max_sessions=args.max_sessions, jobs=args.jobs)
        page = ReportPage(html_page=not args.no_html, self_contained=not args.linked_figures, title=args.title)
        md = build_report(args.out, workdir=args.workdir, sweeps=args.sweep or (), traces=args.trace, search=search,
                          page=page, quick=args.quick, progress=_progress_mode(args))
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


_SEARCH = "capacity search of the report"
_JOBS = Option("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
#: The options of ``engram report``.
REPORT_OPTIONS = (
    Option("workdir", nargs="?", help="measurement folder (microbench.json, runs.json, calibration.json, "
                                      "crosscheck.json)"),
    Option("--out", default="reports/latest", help="report folder (default reports/latest)"),
    Option("--sweep", action="append", metavar="TABLE",
           help="sweep or capacity table to include (engram sim sweep / capacity; repeatable)"),
    Option("--trace", action="append", metavar="SOURCE",
           help="trace source of the what-if curves (repeatable; default: the measured traces, else "
                "Python source and prose from the standard library)"),
    Option("--target", type=float, default=CAPACITY_TARGET, group=_SEARCH,
           help=f"tokens/s every session must reach (default {CAPACITY_TARGET:g})"),
    Option("--compute-ms", type=float, help="compute per step, ms (default: the SPEC §8 reference, ~47 ms)",
           group=_SEARCH),
    Option("--seeds", type=int, help=f"searches per device, each its own seeds (default {REPORT_SEEDS}; --quick 2)",
           group=_SEARCH),
    Option("--max-sessions", type=int, help=f"largest session count probed (default {REPORT_MAX_SESSIONS}; --quick 128)",
           group=_SEARCH),
    _JOBS,
    Option("--title", help="report title"),
    Option("--quick", action="store_true", help="shorter simulations, fewer points"),
    Option("--no-html", action="store_true", help="Markdown only"),
    Option("--linked-figures", action="store_true",
           help="report.html links figures/ and data/ by relative path instead of embedding them"),
    *PROGRESS_OPTIONS,
    JSON_OPTION,
)


REPORT_COMMAND = Command("report", "plotted report: measured, predicted, what-if (Markdown + PNG + HTML)",
                         REPORT_OPTIONS, _typed_os_errors(_cmd_report),
                         description="Write a report folder (report.md, report.html, figures/*.png, data/*.csv, "
                                     "inputs/). It leads with the answer: how many concurrent sessions each device "
                                     "sustains at the target tokens/s (searched with a seed ensemble; with the "
                                     "assumptions and the band over seeds), from its own search and from every "
                                     "capacity table given; then the evidence: the SPEC §8 seed reproduction, "
                                     "predicted vs measured with the error band, tokens/s by threshold, readers and "
                                     "row-cache size, step-latency CDFs, and the figures of sweep tables. Give a "
                                     "folder of engram measure / calibrate (/ crosscheck) results for this machine's "
                                     "figures; without one, the figures use the device presets. report.html is one "
                                     "self-contained file (figures and data embedded) to send on.")


@_typed_errors
def _cmd_demo(args) -> int:
    if args.throttle_iops is not None and not args.throttle_iops:
        raise ArgumentError("--throttle-iops: no rate given (e.g. --throttle-iops 4000,15000); --no-devices "
                            "measures the disk alone")
    size = DemoSize(scale=args.scale, steps=args.steps, rounds=args.rounds)
    measurement = DemoMeasurement(fio=not args.no_fio, wait=args.wait and not args.no_wait,
                                  throttles=() if args.no_devices else args.throttle_iops,
                                  tmpfs=not (args.no_tmpfs or args.no_devices))
    md = run_demo(args.out, workdir=args.workdir, texts=args.text, quick=args.quick, size=size,
                  measurement=measurement, jobs=args.jobs, html_page=not args.no_html, progress=_progress_mode(args))
    html_path = md.with_suffix(".html")
    print(f"report: {md}" + (f"  (HTML: {html_path})" if html_path.exists() and not args.no_html else ""))
    return 0


#: The options of ``engram demo``.
DEMO_OPTIONS = (
    Option("--out", default=DEFAULT_OUT, help=f"report folder (default {DEFAULT_OUT})"),
    Option("--workdir", default=DEFAULT_WORKDIR,
           help=f"work folder: model file, measurements, calibration (default {DEFAULT_WORKDIR})"),
    Option("--text", action="append", metavar="FILE",
           help="your own text (UTF-8 file, or .jsonl prompts) instead of the built-in texts; repeatable"),
    Option("--scale", type=float, help="layout scale of the model file (default 0.02: 4.4 GiB; --quick 0.001)"),
    Option("--steps", type=int, help="decode steps per measured run (default 200; --quick 40)"),
    Option("--rounds", type=int, help="interleaved rounds of measurements (default 5; --quick 2)"),
    _JOBS,
    Option("--quick", action="store_true", help="a small, fast run (smoke test, about 1.5 minutes on 2 cores)"),
    Option("--no-fio", action="store_true", help="skip fio's microbenchmarks even when fio is installed"),
    Option("--wait", action="store_true",
           help="wait for a quiet machine before each measurement (up to 2 minutes in all; default: never, "
                "each run is predicted with the device of its own time window)"),
    Option("--no-wait", action="store_true", help="never wait for a quiet machine (the default)"),
    Option("--throttle-iops", type=_ints, metavar="N[,M...]",
           help="read-IOPS throttles of the disk (cgroups) the devices step measures a smaller grid on, "
                "predicted the planner's way from fio JSON and a datasheet string (default "
                f"{','.join(str(n) for n in DEMO_THROTTLES)}; --quick {DEMO_THROTTLES[0]}); skipped with "
                "the reason where the kernel allows no throttle"),
    Option("--no-tmpfs", action="store_true", help="leave tmpfs out of the devices step"),
    Option("--no-devices", action="store_true", help="no devices step (no throttles, no tmpfs)"),
    Option("--no-html", action="store_true", help="Markdown report only"),
    *PROGRESS_OPTIONS,
)


DEMO_COMMAND = Command("demo", "the main job: build, trace, look up, measure, calibrate, cross-check, "
                               "sweep, report",
                       DEMO_OPTIONS, _cmd_demo,
                       description="Run the whole mission on this machine: build a model file in the real format (V4.1"
                                   " Flash layout at a reduced scale), make traces from real text that ships with "
                                   "Python (or --text), run lookups and gated adds, the measured decode runs, the "
                                   "calibration, the cross-check and a small sweep, and write the report (default "
                                   "reports/demo/). Several minutes on 2 cores with an SSD (README states the measured"
                                   " time); the 4.4 GiB model file is written once and reused on later runs.")


def add_report_command(subparsers) -> None:
    """Add ``engram report`` (an entry point of ``engram.commands``)."""
    add_command(subparsers, REPORT_COMMAND)


def add_demo_command(subparsers) -> None:
    """Add ``engram demo`` (an entry point of ``engram.commands``)."""
    add_command(subparsers, DEMO_COMMAND)
