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

Every command's argparse is in this package, and only here, one module per group of commands:
:mod:`.trace`; :mod:`.decode` (decode, prefill, device); :mod:`.measure` (measure, calibrate,
crosscheck); :mod:`.studies` (sweep, capacity); :mod:`.serve`; :mod:`.report` (report, demo); and
:mod:`.options`, the argument groups and parsing they share.  ``setup.cfg`` registers one
``add_*_command`` function per top-level command as an entry point of the
group ``engram.commands``; ``engram`` loads the one it runs
(:mod:`engram.cli`).  Every subcommand takes ``--json`` for machine-readable
output.
"""

from __future__ import annotations

from engram.options import Command, add_command

from .decode import DECODE_COMMAND, DEVICE_COMMAND, PREFILL_COMMAND
from .measure import CALIBRATE_COMMAND, CROSSCHECK_COMMAND, measure_command
from .report import add_demo_command, add_report_command
from .serve import SERVE_COMMAND
from .studies import CAPACITY_COMMAND, SWEEP_COMMAND
from .trace import TRACE_COMMAND

__all__ = ["SIM_COMMAND", "add_calibrate_command", "add_crosscheck_command", "add_demo_command",
           "add_measure_command", "add_report_command", "add_sim_command", "register"]

#: ``engram sim`` and its subcommands, in ``--help`` order.
SIM_COMMAND = Command("sim", "simulate Engram reads: traces, decode and prefill predictions, studies",
                      subcommands=(TRACE_COMMAND, DECODE_COMMAND, PREFILL_COMMAND, DEVICE_COMMAND, SWEEP_COMMAND,
                                   CAPACITY_COMMAND, SERVE_COMMAND),
                      dest="sim_command",
                      description="A simpy model of Engram row reads (SPEC §9): build traces from real text, predict "
                                  "decode tokens/s and prefill stalls for a device model and a read policy, run "
                                  "what-if studies and capacity searches.")


def add_sim_command(subparsers) -> None:
    """Add ``engram sim`` with ``trace``, ``decode``, ``prefill``, ``device``, ``sweep``, ``capacity`` and ``serve``."""
    add_command(subparsers, SIM_COMMAND)


def add_measure_command(subparsers) -> None:
    """Add ``engram measure``."""
    add_command(subparsers, measure_command())


def add_calibrate_command(subparsers) -> None:
    """Add ``engram calibrate``."""
    add_command(subparsers, CALIBRATE_COMMAND)


def add_crosscheck_command(subparsers) -> None:
    """Add ``engram crosscheck``."""
    add_command(subparsers, CROSSCHECK_COMMAND)


def register(subparsers) -> None:
    """Add every simulator command to ``engram``'s subparsers (the entry points of ``setup.cfg`` add them
    one at a time)."""
    add_sim_command(subparsers)
    add_measure_command(subparsers)
    add_calibrate_command(subparsers)
    add_crosscheck_command(subparsers)
    add_report_command(subparsers)
    add_demo_command(subparsers)
