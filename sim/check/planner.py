"""The planner-mode cross-check: every measured run predicted from a description of its device only.

A capacity planner has no engine microbenchmark and no probe steps of the drive they are about to buy:
they have fio's JSON for it, or a datasheet.  :func:`planner_crosscheck` puts the simulator in their place on
every device a measurement made (:func:`sim.measure.devices.measure_devices`: the disk, throttled volumes,
tmpfs) and predicts each device's runs twice:

``fio``
    the device from the fio JSON saved beside its runs, at the engine's read size
    (:func:`sim.device.presets.load_device`, which reads fio JSON with :mod:`sim.device.fio`).
``datasheet``
    the device from a datasheet string derived from those fio figures (:func:`datasheet_spec`), read by
    :func:`sim.device.presets.load_device` (``ssd:...``: :mod:`sim.device.datasheet`).

The rest of the step is what a planner states: the compute of a step as its spec says (``sleep:5``: 5 ms,
constant; ``none``: 0; specs whose time only a microbenchmark knows -- ``mixer``, ``blas:N`` -- are left out
with the reason), the hash at the simulator's default (0), the read policy of the configuration with the
simulator's defaults (:class:`sim.core.params.Policy`).  Each run is then predicted, compared and summed up
exactly as in :func:`sim.check.crosscheck.crosscheck` -- run by run, with today's 90% intervals
(:mod:`sim.check.intervals`: no window, so the simulator's own error and the model's scatter on the other
configurations) and today's regimes (:mod:`sim.check.regimes`) -- through a :class:`PlannerModels` in
place of the calibration.  Its goals are the planner's (:data:`PLANNER_TARGETS`, quiet or busy alike: tokens/s
and the capacity; a step's p50 is reported, not held).

Datasheet strings (:func:`datasheet_spec`, every figure at the engine's read size):

- an unthrottled device: ``ssd:qd1_us=<fio QD1 mean latency>,iops=<fio's highest IOPS over its depths>,
  routing=random`` (every string here states ``routing=random``: :data:`ROUTING_RULE`);
- a memory-backed device (fio's QD1 median below :data:`sim.device.fio.MEMORY_QD1_P50`: tmpfs, a memory
  copy in the reading thread): ``iops`` = fio's highest IOPS x the CPUs of the runs' machine / fio's jobs,
  and its fio JSON as ``fio:FILE,cpus=<those CPUs>`` -- fio's figures are the copy rate of its jobs' CPUs,
  the engine's readers copy on all the machine's (assumed; said in the result's ``memory_backed``); on the
  host its reads are the profile's copies in both modes (:meth:`sim.decode.host.HostCPU.copy_reads`);
- a throttled volume, as a cloud volume's datasheet gives it: ``qd1_us`` = the raw disk's fio QD1 mean
  latency (the drive behind the volume: without the disk's fio, the volume's QD1 median, the reads that
  did not wait), ``iops`` = the raw disk's highest fio IOPS
  (the disk's own fio beside it), ``cap_iops`` = the volume's highest fio IOPS (its provisioned rate),
  ``burst_ios`` = the budget of one throttle slice at that rate (:data:`THROTTLE_SLICE_S`, the kernel's
  ``throtl_slice`` of ``block/blk-throttle.c``: unused budget is kept up to a slice).  A simulator whose
  ``ssd:`` form has no ``cap_iops`` refuses that string; the device is then predicted from
  ``ssd:qd1_us=<QD1 mean>,iops=<cap_iops>`` (the QD1 mean raised to ``1 / cap_iops`` where it lies below: a
  volume at its rate reads at QD1 at about that) and the result says so (``datasheet_fallback``).

A device that moved while its runs ran cannot be predicted from one fio run (a shared cloud disk's QD1 latency
can move fourfold within minutes).  Where the measurement took fio again after a device's runs
(``fio_after`` of ``devices.json``), each mode predicts the runs a second time from it and judges each run
against the span between the two predictions as well (:func:`between`): the verdict cell gives both, and
how far the two predictions lie apart; the first prediction's verdict is the planner's.

Refused, each with a one-line error: fio JSON of writes, or at a block size other than the engine's read
size on that device (``--fio DEVICE=FILE`` gives a planner's own file), a measurement without a device list,
a device list malformed field by field (:func:`check_devices`).

``planner.json`` (schema :data:`PLANNER_SCHEMA`)::

    {"schema", "kind": "planner_crosscheck", "date", "workdir", "read_size", "devices": [{"name", "class",
      "built", "reason", "fio_file", "datasheet", "datasheet_used", "datasheet_fallback", "memory_backed"
      (only where fio's figures are a memory copy's: the assumption), "assumed" (what the fio file leaves out:
      "device measured back-to-back only ..." or its thinktime jobs, left out), "left_out": {config: reason}, "modes":
      {"fio"|"datasheet": {"device", "refused", "summary": {"tokens_per_s": {"median_abs_error", "max_abs_error",
      ...}, "regime", "pass", "passed", ...}, "capacity": [...],
      "rows": [{"config", "sessions", "measured", "predicted", "error", "error_low", "error_high"}],
      "host_cpu": {...} (:func:`host_cpu`: the configurations where the host binds; absent where fio wrote no CPU
      figures)}},
      "fio_after": {"file", "qd1_mean_us": [before, after], "peak_iops": [before, after], "datasheet", "modes":
      {mode: :func:`between`'s}} (only where fio ran again after the runs),
      "today": {...} or null}], "classes": {class: {mode: {"configurations", "median_abs_error",
      "max_abs_error", "capacity": [...]}}}, "built": [names], "skipped": {name: reason}}
"""

from __future__ import annotations

import copy
import math
import os
import re
import unicodedata
from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from .calibrate import Calibration, calibrate_file
from .crosscheck import crosscheck, crosscheck_files
from .regimes import verdict_text
from sim.device import Device
from sim.device.fio import (HELD_OFF_SHARE, HOST_BOUND_SHARE, MEMORY_QD1_P50, cpu_held_off, cpu_per_read, fio_records,
                            held_off_text, idle_jobs, read_fio_output)
from sim.device.presets import load_device
from sim.core.io import load_json, now_iso, sha256_file, write_json
from sim.core.limits import MAX_QUEUE_DEPTH
from sim.core.params import Compute, Policy
from sim.core.progress import progress as progress_bar
from sim.core.schema import ComputeSpec, check_list, check_mapping, check_number, check_runs, check_str
from sim.decode.host import SESSIONS, HostCPU, engine_profile, process_scale

__all__ = ["DEVICES_NAME", "HOST_BOUND_SHARE", "MODES", "PLANNER_NAME", "PLANNER_SCHEMA", "PLANNER_TARGETS",
           "THROTTLE_SLICE_S", "PlannerModels", "DEVICE_CLASSES", "after_notes", "after_text", "between",
           "datasheet_gap", "datasheet_notes", "host_cpu",
           "check_devices", "check_fio", "check_planner",
           "datasheet_spec", "fio_figures", "host_notes", "is_memory", "markdown_table", "planner_compute",
           "planner_crosscheck"]

#: Schema name of ``planner.json``.
PLANNER_SCHEMA = "engram.planner-crosscheck/1"
#: Its file name in the measurement folder.
PLANNER_NAME = "planner.json"
#: The device list a measurement writes (:data:`sim.measure.devices.DEVICES_NAME`; the simulator does not
#: import the measuring package).
DEVICES_NAME = "devices.json"
#: The two descriptions a device is predicted from.
MODES = ("fio", "datasheet")
#: Unused budget the kernel's read throttle keeps, seconds: one ``throtl_slice`` (HZ / 10; block/blk-throttle.c).
THROTTLE_SLICE_S = 0.1

#: The planner mode's goals (issue 23), in every regime but a loaded one: tokens/s median and max relative error.
#: A planner asks tokens/s and the capacity (held as today: within one grid step); a step's p50 is reported, not
#: held -- a throttled volume's steps are bimodal (a step finds the bucket's tokens or waits for its next grant),
#: so their median jumps between the modes with a shift of a few steps, which tokens/s does not.
PLANNER_TARGETS = {"tokens_per_s_median_abs": 0.05, "tokens_per_s_max_abs": 0.10}
#: How far a datasheet string's IOPS at a depth may run from fio's, either way, before the planner says so
#: (:func:`datasheet_notes`): fio's own depths repeat within a few percent.
DATASHEET_GAP = 1.2
#: How far fio's QD1 mean latency or peak IOPS may move between the runs before and after a device's decode runs
#: before the planner says the device moved (:func:`after_notes`): a shared VM's disk moved 0.8-1.3-fold in most
#: measurements and tenfold in one (BENCHMARKS.md, issue 23).
MOVED_FOLD = 1.5

#: Rows a decode step reads when a run does not record it: 24 a layer, two layers (SPEC).
ROWS_PER_STEP = 48

#: Why the planner's datasheet strings state ``routing=random`` (:mod:`sim.device.datasheet`).
ROUTING_RULE = ("random: a read queues at the channel holding its page, so the latency grows by 1 / iops a read "
                "in flight from QD1 (fio's curves on the disk and the packaged vm-virtio-16core-4k follow it; the "
                "first free channel reaches the IOPS from the knee on, 1.3-1.8x too fast at QD 2 to 8)")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(i?b?)\s*$", re.I)


def _bytes(text: str) -> Optional[int]:
    """fio's block size text (``"4k"``, ``"512"``, ``"4KiB"``) in bytes; None when it is not one size."""
    m = _SIZE.match(str(text))
    if not m:
        return None
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])


def check_fio(path: Union[str, os.PathLike], read_size: int) -> List[dict]:
    """The read jobs of a fio JSON file (:func:`sim.device.fio.fio_records`), checked to describe random reads
    at the engine's read size ``read_size`` (bytes).

    Raises
    ------
    FormatError
        Unreadable, no read job, a job that wrote (names the job and its write count), a block size other than
        ``read_size`` (names it, and the fio option that would match).
    """
    docs = read_fio_output(path)
    for di, doc in enumerate(docs):
        glob = doc.get("global options") or {}
        for ji, job in enumerate(doc.get("jobs") or []):
            if not isinstance(job, dict):
                continue
            w = job.get("write") or {}
            rw = str((job.get("job options") or {}).get("rw", glob.get("rw", "")))
            if (isinstance(w, dict) and (w.get("total_ios") or 0) > 0) or "write" in rw or rw in ("rw", "randrw",
                                                                                                   "trim", "randtrim"):
                raise FormatError(f"{path}: run {di} job {job.get('jobname', ji)!r} is fio of writes (rw={rw or '?'}, "
                                  f"{(w or {}).get('total_ios', 0)} writes): the engine only reads; give fio of "
                                  f"random reads (--rw=randread)")
    recs = fio_records(docs, str(path))
    for r in recs:
        n = _bytes(r["bs"])
        if n != int(read_size):
            raise FormatError(f"{path}: fio ran at block size {r['bs']} ({n if n is not None else '?'} bytes), but "
                              f"the engine reads {int(read_size)}-byte units on this device: run fio with "
                              f"--bs={int(read_size)}")
    return recs


def fio_figures(recs: Sequence[Mapping]) -> dict:
    """``{"qd1_cpu_per_read_us", "qd1_held_off", "qd1_mean_us", "qd1_p50_us", "peak_iops", "peak_qd", "depths"}`` of
    checked fio records (medians where a depth ran more than once; the CPU a read took at QD1,
    :func:`sim.device.fio.cpu_per_read`, None when fio's JSON has no CPU figures; ``qd1_held_off``: the QD1 runs'
    in-flight share where they waited for their CPU, :func:`sim.device.fio.cpu_held_off`, else None).

    Raises
    ------
    FormatError
        No run at queue depth 1.
    """
    by: Dict[int, List[Mapping]] = {}
    for r in recs:
        by.setdefault(int(r["qd"]), []).append(r)
    if 1 not in by:
        raise FormatError(f"fio output without a run at queue depth 1 (depths {sorted(by)}): a datasheet's QD1 "
                          f"latency needs one")
    iops = {k: float(np.median([r["iops"] for r in v])) for k, v in by.items()}
    peak_qd = max(iops, key=lambda k: iops[k])
    p50 = [r["pct"].get(50.0) for r in by[1] if r["pct"].get(50.0) is not None]
    cpu = cpu_per_read(by[1])
    return {"qd1_cpu_per_read_us": cpu * 1e6 if cpu is not None else None, "qd1_held_off": cpu_held_off(by[1]),
            "qd1_mean_us": float(np.median([r["mean"] for r in by[1]])) * 1e6,
            "qd1_p50_us": float(np.median(p50)) * 1e6 if p50 else None,
            "peak_iops": iops[peak_qd], "peak_qd": int(peak_qd), "depths": sorted(by),
            "jobs": int(np.median([r.get("jobs", 1) for r in recs]))}


def is_memory(fig: Mapping) -> bool:
    """True when fio's figures (:func:`fio_figures`) are a memory copy's: a QD1 median below
    :data:`sim.device.fio.MEMORY_QD1_P50`."""
    return fig.get("qd1_p50_us") is not None and fig["qd1_p50_us"] < MEMORY_QD1_P50 * 1e6


def datasheet_spec(fig: Mapping, raw: Optional[Mapping] = None, throttled: bool = False,
                   cpus: Optional[int] = None, memory: bool = False) -> tuple:
    """``(spec, fallback spec or None, rules)``: the datasheet string of a device from its fio figures
    (:func:`fio_figures`; ``raw``: the unthrottled disk's, for a throttled volume; ``cpus``: the CPUs the
    engine's readers had, for a memory-backed device: fio's figures say so, :func:`is_memory`, or ``memory``,
    the planner does) -- see the module for the rules; ``fallback`` is the
    string without ``cap_iops`` and ``burst_ios``, for a simulator that has no rate-limited volume; ``rules``
    says where each figure came from."""
    if not throttled:
        qd1, iops = fig["qd1_mean_us"], fig["peak_iops"]
        rules = {"qd1_us": "fio's QD1 mean latency", "iops": f"fio's highest IOPS (QD {fig['peak_qd']})"}
        if cpus is not None and (memory or is_memory(fig)):
            jobs = max(1, int(fig.get("jobs") or 1))
            iops = iops * cpus / jobs
            rules["iops"] += (f" x {cpus} / {jobs}: a memory copy (QD1 median {fig['qd1_p50_us']:.1f} us) runs on "
                              f"the readers' {cpus} CPU(s) where fio's {jobs} job(s) had {jobs} (assumed)")
        rules["routing"] = ROUTING_RULE
        spec = f"ssd:qd1_us={qd1:.1f},iops={iops:.0f},routing=random"
        return spec, None, rules
    cap = fig["peak_iops"]
    if raw is not None:
        qd1 = raw["qd1_mean_us"]
        qrule = "the raw disk's fio QD1 mean latency (the drive behind the volume, its own datasheet figure)"
    else:
        qd1 = fig["qd1_p50_us"] if fig.get("qd1_p50_us") else fig["qd1_mean_us"]
        qrule = "fio's QD1 median latency (the raw device's, while the budget lasts)"
    rules = {"qd1_us": qrule,
             "cap_iops": f"the volume's highest fio IOPS (QD {fig['peak_qd']})",
             "burst_ios": f"one throttle slice ({THROTTLE_SLICE_S:g} s, blk-throttle's throtl_slice) at cap_iops"}
    if raw is not None and raw["peak_iops"] > cap:
        iops = raw["peak_iops"]
        rules["iops"] = f"the raw disk's highest fio IOPS (QD {raw['peak_qd']})"
    else:
        iops = cap
        rules["iops"] = ("cap_iops: no fio of the raw disk above the cap" if raw is None else
                         f"cap_iops: the raw disk's fio ({raw['peak_iops']:.0f} IOPS) is not above the cap, so "
                         f"the throttle does not bind")
    burst = max(1, int(round(cap * THROTTLE_SLICE_S)))
    rules["routing"] = ROUTING_RULE
    spec = f"ssd:qd1_us={qd1:.1f},iops={iops:.0f},cap_iops={cap:.0f},burst_ios={burst},routing=random"
    # a rate-limited volume at QD1 reads at its rate: its QD1 mean is 1 / cap_iops within a little, and the
    # ssd: form needs qd1_us >= 1 / iops -- raised to it where fio's mean lies just below
    floor_us = math.ceil(1e6 / cap * 10) / 10
    fallback = f"ssd:qd1_us={max(round(fig['qd1_mean_us'], 1), floor_us):.1f},iops={cap:.0f}"
    return spec, fallback, rules


def planner_compute(spec: str) -> Compute:
    """A step's compute as a planner states it: the sum of the ``sleep:MS`` and ``spin:MS`` parts, constant
    (``none``: 0).

    Raises
    ------
    ArgumentError
        The spec holds ``mixer`` or ``blas:N``, whose time only a microbenchmark knows (names the spec).
    """
    cs = ComputeSpec.parse(spec)
    if cs.mixer or any(k == "blas" for k, _ in cs.extra):
        raise ArgumentError(f"compute {cs.label!r}: its time is known only from a microbenchmark (mixer, blas); "
                            f"planner mode states a step's compute as sleep:MS or spin:MS")
    return Compute(sum(float(a) for _, a in cs.extra) * 1e-3)


@dataclass
class PlannerModels(Calibration):
    """A :class:`sim.check.calibrate.Calibration` holding only what a planner has: one device for every backend,
    computes as stated (:func:`planner_compute`), hash 0, no windows, the simulator's default policy, and the
    host the planner names (``host_cpu``: its CPUs, the engine's shipped CPU profile, the CPU a read takes;
    :mod:`sim.decode.host`; None: the host is left out)."""

    host_cpu: Optional[HostCPU] = None
    profile: Optional[Mapping] = None

    def host(self, compute: str, mode: str = "threads") -> Optional[HostCPU]:
        """``host_cpu`` with the spin of ``compute`` (its ``spin:MS`` parts), its CPU a step and a read scaled for
        sessions run as ``mode`` (:func:`sim.decode.host.process_scale`: the profile's ``process_cpu_ratio`` for
        processes); None without a host."""
        if self.host_cpu is None:
            return None
        spin = sum(float(a) for k, a in ComputeSpec.parse(compute).extra if k == "spin") * 1e-3
        h = replace(self.host_cpu, spin_s=spin)
        scale, note = process_scale(self.profile or {}, mode if mode in SESSIONS else "threads")
        if mode == "processes":
            h = replace(h, step_cpu_s=h.step_cpu_s * scale, read_cpu_s=h.read_cpu_s * scale, sessions="processes",
                        source=f"{h.source}; {note}" if note else h.source)
        return h

    def device(self, backend: str, compute: str = "none") -> Device:
        return self.devices[backend if backend in self.devices else next(iter(self.devices))]

    def policy(self, threshold: int, backend: str, readers: int) -> Policy:
        return Policy(threshold=int(threshold), backend=backend, readers=int(readers))

    def compute_model(self, spec: str) -> Compute:
        return planner_compute(spec)

    @classmethod
    def of(cls, device: Device, description: str, host: Optional[HostCPU] = None,
           profile: Optional[Mapping] = None) -> "PlannerModels":
        """The planner's models of one device described by ``description`` (a path or a spec string), on
        ``host`` (None: the host left out) as sessions of threads, scaled for processes by ``profile`` (the
        engine's CPU profile, :func:`sim.decode.host.engine_profile`)."""
        return cls(devices={"pread": device, "io_uring": device}, compute={}, hash_s=0.0,
                   source={"planner": description}, date="", host_cpu=host, profile=profile)


def _today(folder: Path, run: bool = False, sim_steps: Optional[int] = None, seed: int = 0) -> Optional[dict]:
    """Today's cross-check of a device (its ``crosscheck.json``: the calibrated device and compute in each
    run's own window), summed up as the planner's modes are; None when there is none (``run``: calibrate its
    ``microbench.json`` and cross-check its runs first when it has none).  A ``crosscheck.json`` of other runs
    (its ``runs.sha256`` is not the folder's ``runs.json``'s: a later measurement in the same folder) is not
    these runs' and is left alone: the runs' own goes to ``crosscheck-planner-today.json``."""
    p = folder / "crosscheck.json"
    if p.is_file() and (load_json(p).get("runs") or {}).get("sha256") != sha256_file(folder / "runs.json"):
        p = folder / "crosscheck-planner-today.json"  # another measurement's cross-check: not these runs'
        if p.is_file() and (load_json(p).get("runs") or {}).get("sha256") != sha256_file(folder / "runs.json"):
            p.unlink()
    if not p.is_file() and run and (folder / "microbench.json").is_file():
        cal = folder / ("calibration.json" if p.name == "crosscheck.json" else "calibration-planner-today.json")
        calibrate_file(folder / "microbench.json", cal, seed=seed)
        crosscheck_files(cal, folder / "runs.json", p, sim_steps=sim_steps, seed=seed)
    if not p.is_file():
        return None
    doc = load_json(p)
    return _mode_result(doc, "calibration + windows")


def _worst(m: Mapping) -> str:
    """The sign and the run of a mode's largest tokens/s error, for the table's max cell: `` (too fast: 8 sessions
    as threads)`` where the prediction ran above the measurement; "" where no row has an error that is a number
    (NaN is none) or the largest is 0.  Never raises on a partial document."""
    rows = m.get("rows") if isinstance(m, Mapping) else None
    errs = [(_real(r.get("error")), r) for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []
    errs = [(e, r) for e, r in errs if e is not None and not math.isnan(e)]
    if not errs:
        return ""
    e, r = max(errs, key=lambda er: abs(er[0]))
    if e == 0:
        return ""
    n, mode = r.get("sessions"), r.get("mode")
    n = n if isinstance(n, Integral) and not isinstance(n, bool) else "?"
    who = f"{n} session{'' if n == 1 else 's'}" + (f" as {mode}" if isinstance(mode, str) and mode else "")
    return f" ({'too fast' if e > 0 else 'too slow'}: {_cell(who)})"


def _mode_result(doc: Mapping, device: str, refused: str = "") -> dict:
    s = doc["summary"]
    rows = [{"config": r["key"], "sessions": r["sessions"], "mode": r.get("mode"),
             "measured": r["measured"]["tokens_per_s"], "predicted": r["predicted"]["tokens_per_s"],
             "error": r["error"]["tokens_per_s"], "error_low": r["interval"].get("error_low"),
             "error_high": r["interval"].get("error_high"), "inside": r["inside_interval"]}
            for r in list(doc.get("rows") or []) + list(doc.get("session_rows") or [])]
    keep = ("configurations", "runs", "tokens_per_s", "step_p50", "sessions", "inside_interval",
            "inside_interval_share", "regime", "row_cache", "goals", "pass", "passed")
    caps = [{k: c[k] for k in ("mode", "sessions", "target_tokens_per_s", "measured_capacity", "predicted_capacity",
                               "all_met", "within_one_step", "measured_slowest", "predicted_slowest")}
            for c in doc.get("capacity") or []]
    return {"device": device, "refused": refused, "summary": {k: s[k] for k in keep if k in s}, "capacity": caps,
            "rows": rows}


def _planner_runs(runs_doc: Mapping) -> tuple:
    """``(runs document with the configurations a planner can state, {config key: why left out})``."""
    left, keep = {}, []
    for c in runs_doc.get("configs") or []:
        try:
            planner_compute(c.get("compute", "none"))
            keep.append(c)
        except ArgumentError as exc:
            left[c.get("key", "?")] = str(exc)
    keys = {c.get("key") for c in keep}
    return dict(runs_doc, configs=keep, runs=[r for r in runs_doc.get("runs") or [] if r.get("config") in keys]), left


def host_cpu(fig: Mapping, runs_doc: Mapping, rows: Sequence[Mapping],
             memory_read_cpu_us: Optional[float] = None) -> Optional[dict]:
    """Where the host, not the drive, binds: the share of the host's CPUs the predicted reads of each configuration
    take by fio's own CPU per read.

    ``share = predicted tokens/s x sessions x rows a step x CPU per read / CPUs``, with the CPU per read of fio's
    QD1 jobs (``fig["qd1_cpu_per_read_us"]``, :func:`fio_figures`), the rows a step of the configuration's runs
    (their median ``rows_distinct_mean``; :data:`ROWS_PER_STEP` where not recorded) and the CPUs of the runs'
    machine (:func:`_cores`).  A configuration at :data:`HOST_BOUND_SHARE` or more is host-bound: fio describes
    the drive, not the host that drives it, so its prediction is an upper bound.

    Parameters
    ----------
    fig : mapping
        The device's fio figures.
    runs_doc : mapping
        The runs predicted (``configs``, ``runs``, ``machine``).
    rows : sequence of mapping
        A mode's rows (``config``, ``sessions``, ``predicted`` tokens/s of one session, ``error``).
    memory_read_cpu_us : float, optional
        For a memory-backed device: the engine's CPU a read from tmpfs (the CPU profile's
        ``memory_read_cpu_us``: :mod:`sim.decode.host`), taken instead of fio's, which there is mostly fio's own
        and its engine's (``cpu_source`` says which).

    Returns
    -------
    dict or None
        ``{"cpu_per_read_us", "cores", "bound_share", "rule", "shares": {config: share}, "bound": [configs],
        "free": {"configurations", "median_abs_error", "max_abs_error"} or None}`` (``free``: the rows that are not
        host-bound); None when fio's JSON has no CPU figures.  A row without a prediction (None or NaN) has no
        share; one whose error is None or NaN is left out of ``free``'s errors.

    Raises
    ------
    FormatError
        ``machine`` or ``machine.cores`` (:func:`_cores`), ``runs`` or a run's ``rows_distinct_mean`` (not null or
        a finite number >= 0) malformed in ``runs_doc``.
    ArgumentError
        ``fig``'s CPU per read not None or a finite number > 0; a row without a ``config``, a ``predicted`` that is
        negative, infinite or not a number, ``sessions`` not a whole number >= 1, an ``error`` not a number.
    """
    cpu, source = fig.get("qd1_cpu_per_read_us"), "fio's"
    if memory_read_cpu_us is not None:
        cpu, source = memory_read_cpu_us, "the engine's pread from tmpfs,"
    if cpu is None:
        return None
    if isinstance(cpu, bool) or not isinstance(cpu, Real) or not (math.isfinite(cpu) and cpu > 0):
        raise ArgumentError(f"host_cpu: fig qd1_cpu_per_read_us = {cpu!r:.40}: expected a finite number > 0 "
                            "(microseconds) or None")
    cores = _cores(runs_doc)
    per: Dict[str, List[float]] = {}
    runs = runs_doc.get("runs") or []
    if not isinstance(runs, list):
        raise FormatError(f"runs = {runs!r:.40}: expected a list")
    for i, r in enumerate(runs):
        v = r.get("rows_distinct_mean") if isinstance(r, Mapping) else None
        if v is None:
            continue  # not recorded: ROWS_PER_STEP
        if isinstance(v, bool) or not isinstance(v, Real) or not (math.isfinite(v) and v >= 0):
            raise FormatError(f"runs[{i}] ({r.get('config')}).rows_distinct_mean = {v!r:.40}: expected a finite "
                              "number >= 0 (distinct rows a step)")
        per.setdefault(r.get("config"), []).append(float(v))
    shares, free = {}, []
    for i, r in enumerate(rows):
        at = f"host_cpu: rows[{i}]"
        if not isinstance(r, Mapping) or not isinstance(r.get("config"), str):
            raise ArgumentError(f"{at}: expected a mapping with a 'config' key string, got {r!r:.60}")
        at = f"{at} ({r['config']})"
        step = float(np.median(per[r["config"]])) if r["config"] in per else float(ROWS_PER_STEP)
        pred = r.get("predicted")
        if pred is None or (isinstance(pred, float) and math.isnan(pred)):
            continue  # not predicted
        if isinstance(pred, bool) or not isinstance(pred, Real) or not (math.isfinite(pred) and pred >= 0):
            raise ArgumentError(f"{at}.predicted = {pred!r:.40}: expected a finite number >= 0 (tokens/s) or None")
        n = r.get("sessions", 1)
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
            raise ArgumentError(f"{at}.sessions = {n!r:.40}: expected a whole number >= 1")
        shares[r["config"]] = float(pred) * int(n) * step * float(cpu) * 1e-6 / cores
        if shares[r["config"]] < HOST_BOUND_SHARE:
            err = r.get("error")
            if err is not None and (isinstance(err, bool) or not isinstance(err, Real)):
                raise ArgumentError(f"{at}.error = {err!r:.40}: expected a number (the tokens/s error) or None")
            if err is not None and math.isfinite(err):
                free.append(abs(float(err)))  # None or NaN: not measured, left out of the others' errors
    bound = [k for k, v in shares.items() if v >= HOST_BOUND_SHARE]
    return {"cpu_per_read_us": float(cpu), "cpu_source": source, "cores": cores, "bound_share": HOST_BOUND_SHARE,
            "shares": shares,
            "bound": bound,
            "free": ({"configurations": len(free), "median_abs_error": float(np.median(free)),
                      "max_abs_error": float(max(free))} if free else None),
            "rule": ((f"fio's CPU per read at QD1 ({cpu:.1f} us, usr + sys)" if memory_read_cpu_us is None else
                      f"the engine's CPU a read from tmpfs ({cpu:.1f} us, the CPU profile's)")
                     + " x the predicted reads/s over the runs' "
                     f"{cores} CPU(s); at {HOST_BOUND_SHARE:g} or more the host binds (fio leaves out the engine's "
                     "own work on those CPUs) and the prediction is an upper bound")}


def _cores(runs_doc: Mapping) -> int:
    """CPUs of the machine the runs ran on (``machine.cores`` of ``runs.json``; 1 when not recorded).

    Raises
    ------
    FormatError
        ``machine`` not an object, ``cores`` not null or a whole number in [1, 4096].
    """
    machine = runs_doc.get("machine") or {}
    if not isinstance(machine, Mapping):
        raise FormatError(f"machine = {machine!r:.40}: expected a JSON object")
    c = machine.get("cores")
    if c is None:
        return 1
    if isinstance(c, bool) or not isinstance(c, Integral) or not 1 <= c <= 4096:
        raise FormatError(f"machine.cores = {c!r:.40}: expected a whole number of CPUs in [1, 4096] (or null: "
                          "not recorded)")
    return int(c)


#: Device classes a measurement makes (:mod:`sim.measure.devices`).
DEVICE_CLASSES = ("disk", "throttled", "tmpfs")


def _control(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, a tab, an escape: Unicode category Cc)."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def _inside(rel) -> bool:
    """Whether ``rel`` is a path inside the measurement folder as written: a non-empty relative path without a
    ``..`` part or a control character (symbolic links are the measurement's own)."""
    return (isinstance(rel, str) and bool(rel) and not _control(rel) and not Path(rel).is_absolute()
            and ".." not in Path(rel).parts)


def _good_read_size(rs) -> bool:
    return not isinstance(rs, bool) and isinstance(rs, int) and 512 <= rs <= 1 << 20


def check_planner(doc: Mapping, where: Union[str, os.PathLike]) -> Mapping:
    """A ``planner.json`` document read back (by ``engram report``), checked where its tables and notes read it:
    ``devices`` a list of objects, each with a ``name`` string; a device's ``modes`` (and ``today``) objects, each
    with a ``summary`` object unless ``refused`` (a string), its ``tokens_per_s`` errors numbers or null, and
    ``capacity`` a list of objects with ``mode``, ``all_met``, ``measured_capacity``, ``predicted_capacity`` and
    ``within_one_step``; ``classes`` an object of objects of objects, ``built`` a list, ``skipped`` an object.
    Returns the document as it is.

    Raises
    ------
    FormatError
        The first field that is not so, named with ``where`` (``planner.json: devices[0].modes.fio: capacity[1]:
        ...``; :mod:`sim.core.schema`'s checks).
    """
    def errors(t: Mapping, at: str) -> None:
        for k in ("median_abs_error", "max_abs_error"):
            check_number(at, k, t.get(k), low=None, none=True)

    check_mapping(str(where), "the document", doc)
    for i, e in enumerate(check_list(str(where), "devices", doc.get("devices", []))):
        at = f"{where}: devices[{i}]"
        check_mapping(str(where), f"devices[{i}]", e)
        check_str(at, "name", e.get("name"))
        for k in ("fio_file", "datasheet_used", "class"):
            if e.get(k) is not None:
                check_str(at, k, e[k])
        modes = dict(check_mapping(at, "modes", e.get("modes", {})))
        if e.get("today") is not None:
            modes["today"] = e["today"]
        for mode, m in modes.items():
            mode_at = f"{at}.{mode}" if mode == "today" else f"{at}.modes.{mode}"
            check_mapping(at, mode if mode == "today" else f"modes.{mode}", m)
            if m.get("refused"):
                check_str(mode_at, "refused", m["refused"])
                continue
            summary = check_mapping(mode_at, "summary", m.get("summary"))
            errors(check_mapping(mode_at, "summary.tokens_per_s", summary.get("tokens_per_s", {})),
                   f"{mode_at}.summary.tokens_per_s")
            for j, c in enumerate(check_list(mode_at, "capacity", m.get("capacity", []))):
                check_mapping(mode_at, f"capacity[{j}]", c)
                check_mapping(mode_at, f"capacity[{j}].all_met", c.get("all_met"))
                missing = [k for k in ("mode", "measured_capacity", "predicted_capacity", "within_one_step")
                           if k not in c]
                if missing:
                    raise FormatError(f"{mode_at}: capacity[{j}] has no {', '.join(missing)}")
    for cls, modes in check_mapping(str(where), "classes", doc.get("classes", {})).items():
        for mode, c in check_mapping(str(where), f"classes.{cls}", modes).items():
            errors(check_mapping(str(where), f"classes.{cls}.{mode}", c), f"{where}: classes.{cls}.{mode}")
    check_list(str(where), "built", doc.get("built", []))
    check_mapping(str(where), "skipped", doc.get("skipped", {}))
    return doc


def check_devices(doc: Mapping, where: Union[str, os.PathLike]) -> List[dict]:
    """The ``devices`` of a ``devices.json`` document, checked field by field before anything is read: each a
    copy with its ``read_size`` the one the planner uses everywhere -- its own, else (absent or null) the
    document's top-level ``read_size``, else absent (the engine's 4096 bytes) -- the document left as it is.

    Names: a device's name is a cell of ``planner.md``'s tables (one line a row) and a word of one-line errors,
    so a name with a control character (a newline, a tab, an escape) is refused here; a ``|`` in it, which
    Markdown reads as a column's end, is escaped where the tables are written (:func:`markdown_table`).

    Raises
    ------
    FormatError
        Not an object, no ``devices`` list, an entry that is not an object, a ``name`` that is not a non-empty
        string, holds a control character or repeats, a ``class`` other than disk/throttled/tmpfs,
        ``built``/``measured`` not true or false, a ``folder`` that is not a relative path inside the
        measurement, a ``read_size`` (a device's or the top-level one) that is not a whole number of bytes in
        [512, 1 MiB], ``fio`` or ``fio_after`` not an object of size -> file, or a file of it that is not a
        relative path inside the measurement, as ``folder`` (absolute, with a ``..`` part or a control
        character) (names the entry and key).
    """
    if not isinstance(doc, Mapping) or not isinstance(doc.get("devices"), list):
        raise FormatError(f"{where}: no 'devices' list (a device list of engram measure --throttle-iops/--tmpfs)")
    top = doc.get("read_size")
    if top is not None and not _good_read_size(top):
        raise FormatError(f"{where}: read_size = {top!r} is not a whole number of bytes in [512, 1048576]")
    seen, out = set(), []
    for i, d in enumerate(doc["devices"]):
        at = f"{where}: devices[{i}]"
        if not isinstance(d, Mapping):
            raise FormatError(f"{at} is not an object")
        name = d.get("name")
        if not isinstance(name, str) or not name.strip():
            raise FormatError(f"{at}.name = {name!r} is not a device name")
        if _control(name):
            raise FormatError(f"{at}.name = {name!r} holds a control character (a newline, a tab, an escape): not "
                              "a device name")
        if name in seen:
            raise FormatError(f"{at}.name = {name!r} is given twice")
        seen.add(name)
        if d.get("class") not in DEVICE_CLASSES:
            raise FormatError(f"{at} ({name}).class = {d.get('class')!r}: expected one of {', '.join(DEVICE_CLASSES)}")
        for key in ("built", "measured"):
            if key in d and not isinstance(d[key], bool):
                raise FormatError(f"{at} ({name}).{key} = {d[key]!r} is not true or false")
        if d.get("built") and d.get("measured"):
            folder = d.get("folder")
            if not _inside(folder):
                raise FormatError(f"{at} ({name}).folder = {folder!r} is not a folder inside the measurement")
        rs = d.get("read_size")
        if rs is not None and not _good_read_size(rs):
            raise FormatError(f"{at} ({name}).read_size = {rs!r} is not a whole number of bytes in [512, 1048576]")
        for key in ("fio", "fio_after"):
            fio = d.get(key)
            if fio is not None and (not isinstance(fio, Mapping) or
                                    not all(isinstance(k, str) and isinstance(v, str) and v for k, v in fio.items())):
                raise FormatError(f"{at} ({name}).{key} = {fio!r:.80} is not an object of block size -> fio JSON "
                                  "file")
            for k, rel in (fio or {}).items():
                if not _inside(rel):
                    raise FormatError(f"{at} ({name}).{key}[{k!r}] = {rel!r} is not a file inside the measurement "
                                      "(a relative path without '..', as folder)")
        d = dict(d)
        if rs is None and top is not None:
            d["read_size"] = top
        out.append(d)
    return out


def _fio_overrides(items: Sequence[str]) -> Dict[str, Path]:
    out = {}
    for it in items or ():
        name, sep, path = str(it).partition("=")
        if not sep or not name or not path:
            raise ArgumentError(f"--fio {it!r}: give DEVICE=FILE (a device of devices.json and a fio JSON file)")
        out[name.strip()] = Path(path.strip())
    return out


def planner_crosscheck(workdir: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None, *,
                       fio: Sequence[str] = (), sim_steps: Optional[int] = None, seed: int = 0,
                       progress: Union[bool, str] = False, today: bool = False, host: bool = True) -> dict:
    """Predict every run of every device of a measurement from its fio JSON and from a datasheet string only.

    Parameters
    ----------
    workdir : path
        A measurement folder of ``engram measure --throttle-iops ... [--tmpfs]`` (its ``devices.json``).
    out : path, optional
        Where to write ``planner.json`` (default ``workdir/planner.json``).
    fio : sequence of str
        ``DEVICE=FILE``: a planner's own fio JSON for a device instead of the one measured beside its runs.
    sim_steps, seed
        As :func:`sim.check.crosscheck.crosscheck`.
    today : bool
        Calibrate and cross-check (today's way: :mod:`sim.check.calibrate`, :mod:`sim.check.crosscheck`) each device
        folder that has no ``crosscheck.json`` yet, to show beside the planner's figures.
    host : bool
        Model the host's CPUs (:mod:`sim.decode.host`): the runs' machine's CPUs as the planner states them, the
        engine's own CPU a step from its shipped profile (:func:`sim.decode.host.engine_profile`), the CPU a read
        takes from fio's own figures (the profile's where fio has none, and for a datasheet string); said in
        each mode's ``host_model``.  False: the drive alone, as before.

    Returns
    -------
    dict
        The ``planner.json`` document (see the module).

    Raises
    ------
    ArgumentError
        No device list in ``workdir``, ``--fio`` naming no device of it, bad ``--fio`` text.
    FormatError
        A fio file of writes, of another block size than the engine's read size, without a QD1 run;
        malformed documents (names the file).
    """
    work = Path(workdir)
    dpath, ddoc, devices = _device_list(work)
    overrides = _fio_overrides(fio)
    names = [d.get("name") for d in devices]
    for n in overrides:
        if n not in names:
            raise ArgumentError(f"--fio {n}=...: no device {n!r} in {dpath} (devices: {', '.join(map(str, names))})")
    built = [d for d in devices if d.get("built") and d.get("measured")]
    depths = ddoc.get("fio_depths") if isinstance(ddoc.get("fio_depths"), list) else []
    depths = [k for k in depths if isinstance(k, int) and not isinstance(k, bool)]
    figs, files = _fio_files(work, built, overrides, depths=depths)
    after_figs, after_files = _fio_files(work, built, overrides, "fio_after", depths)
    raw = next((figs[d["name"]] for d in built if d["class"] == "disk" and d["name"] in figs), None)
    # the raw disk behind a throttled volume, after the runs: only where the first prediction had the disk's own
    raw_after = None if raw is None else next(
        (after_figs[d["name"]] for d in built
         if d["class"] == "disk" and d["name"] in after_figs and d["name"] in figs), raw)
    total = sum(len(MODES) * (2 if d["name"] in after_files else 1) for d in built if d["name"] in files)
    with progress_bar(max(total, 1), "planner", "device x mode", mode=progress) as bar:
        planner = _Planner(work, files, figs, raw, sim_steps, seed, today, bar, engine_profile() if host else None,
                           after_files, after_figs, raw_after, overrides)
        result = [planner.entry(d) for d in devices]
    res = {"schema": PLANNER_SCHEMA, "kind": "planner_crosscheck", "date": now_iso(), "workdir": str(work),
           "read_size": ddoc.get("read_size"), "devices": result, "classes": _classes(result),
           "built": [e["name"] for e in result if e["built"]],
           "skipped": {e["name"]: e["reason"] for e in result if not e["built"]}}
    write_json(Path(out) if out is not None else work / PLANNER_NAME, res)
    return res


def _device_list(work: Path) -> tuple:
    """``(its path, the devices.json document, its checked device list)`` of a measurement folder.

    Raises
    ------
    ArgumentError
        No device list in ``work``.
    """
    dpath = work / DEVICES_NAME
    if not dpath.is_file():
        raise ArgumentError(f"{dpath}: no device list: measure with engram measure --throttle-iops N (or --tmpfs) "
                            f"first, which writes it")
    ddoc = load_json(dpath, "devices")
    return dpath, ddoc, check_devices(ddoc, dpath)


def _read_size(d: Mapping) -> int:
    """The engine's read size on device ``d`` of :func:`check_devices` (its own or the document's), bytes: 4096
    where devices.json gives none."""
    return int(d.get("read_size") or 4096)


def _fio_files(work: Path, built: Sequence[Mapping], overrides: Mapping[str, Path], key: str = "fio",
               depths: Sequence[int] = ()) -> tuple:
    """``(fio figures by device, fio file by device)`` of the built devices that have one, every file checked
    (:func:`check_fio`) before anything is simulated: a file of the measurement must hold every depth it ran
    fio at (``depths``: ``devices.json``'s ``fio_depths``; a planner's own file need not).  ``key="fio_after"``:
    the fio taken after each device's runs instead (none for a device whose fio a planner's own file
    overrides)."""
    figs, files = {}, {}
    for d in built:
        size = _read_size(d)
        rel = (d.get(key) or {}).get(str(size))
        path = (overrides.get(d["name"]) if key == "fio" else None) or (work / rel if rel else None)
        if path is None or (key != "fio" and d["name"] in overrides):
            continue
        files[d["name"]] = path
        try:
            figs[d["name"]] = fio_figures(check_fio(path, size))
        except FormatError as exc:
            raise FormatError(exc if str(path) in str(exc) else f"{path}: {exc}") from None
        own = path == overrides.get(d["name"])  # a planner's own file: its depths are the planner's
        missing = [] if own else sorted(set(depths or ()) - set(figs[d["name"]]["depths"]))
        if missing:
            raise FormatError(f"{path}: fio at depths {figs[d['name']]['depths']}, but the measurement ran it at "
                              f"{sorted(depths)} ({DEVICES_NAME} fio_depths): depth(s) {missing} missing, the file "
                              "cut short?")
    return figs, files


def _refused(device: str, why: str) -> dict:
    """A mode's result when the simulator refuses its device description."""
    return {"device": device, "refused": why, "summary": {}, "capacity": [], "rows": []}


@dataclass
class _Planner:
    """The planner's pass over a measurement's devices: the folder, each device's fio file and figures, the raw
    disk's figures (``raw``, behind a throttled volume), the simulation's steps and seed, whether to run
    today's cross-check where missing, and the progress bar."""

    work: Path
    files: Mapping[str, Path]
    figs: Mapping[str, Mapping]
    raw: Optional[Mapping]
    sim_steps: Optional[int]
    seed: int
    today: bool
    bar: object
    profile: Optional[Mapping] = None
    after_files: Mapping[str, Path] = field(default_factory=dict)
    after_figs: Mapping[str, Mapping] = field(default_factory=dict)
    raw_after: Optional[Mapping] = None
    overrides: Mapping[str, Path] = field(default_factory=dict)

    def host(self, d: Mapping, mode: str, runs_doc: Mapping, fig: Optional[Mapping] = None) -> Optional[HostCPU]:
        """The host of ``mode``'s prediction of device ``d`` (None without a profile): the runs' machine's CPUs,
        the profile's engine CPU a step, a read's CPU from fio's own figures (fio mode: ``fig``, the figures the
        device is described by, else those before its runs) or the profile's (a datasheet says none), scaled by
        the profile's engine-to-fio ratio of CPU per read; on a memory-backed device (:meth:`memory`) the
        profile's pread from tmpfs, in both modes (none where the profile has none); on a drive, a step's
        wake-up (the profile's ``wake_us``: :class:`sim.decode.host.HostCPU`)."""
        if self.profile is None:
            return None
        p, cores = self.profile, _cores(runs_doc)
        fig = self.figs[d["name"]] if fig is None else fig
        recorded = (runs_doc.get("machine") or {}).get("cores") is not None
        base = (f"{cores} CPUs ({'the runs' + chr(39) + ' machine' if recorded else 'assumed: the runs did not record machine.cores'}); "
                f"the engine's {p['step_cpu_us']:.0f} us a step (its shipped profile, "
                f"{(p.get('machine') or {}).get('cpu', '?')})")
        fio_us = fig.get("qd1_cpu_per_read_us") if mode == "fio" else None
        if self.memory(d):  # a copy in the reader: the engine's own pread from tmpfs, not fio's nor a drive's
            mem = p.get("memory_read_cpu_us")
            if mem is not None:
                return HostCPU(cores, p["step_cpu_us"] * 1e-6, float(mem) * 1e-6,
                               source=f"{base}; {float(mem):.1f} us a read (the profile's pread from tmpfs: a "
                                      "memory-backed device)")
            return HostCPU(cores, p["step_cpu_us"] * 1e-6, 0.0, source=base + "; a read's CPU left in the "
                           "memory-backed device's own service (cpus=N): the profile has no memory read and "
                           "its drive's does not hold")
        read_us, said = (fio_us, "fio's QD1 CPU per read") if fio_us else (p["read_cpu_us"], "the profile's")
        if fio_us and fig.get("qd1_held_off") is not None:
            said += f"; {held_off_text(fig['qd1_held_off'])}"
        ratio = float(p.get("read_cpu_ratio") or 1.0)
        wake = float(p.get("wake_us") or 0.0)
        return HostCPU(cores, p["step_cpu_us"] * 1e-6, read_us * ratio * 1e-6,
                       source=f"{base}; {read_us:.1f} us a read ({said}) x {ratio:.2f} (the engine's pread over "
                              "fio's, from the profile)" + (f"; a step's wake-up {wake:.0f} us x the CPUs' idle "
                                                             "share (the profile's)" if wake else ""),
                       wake_s=wake * 1e-6)

    def memory(self, d: Mapping) -> bool:
        """Whether device ``d`` is described as memory-backed: fio's figures say so (:func:`is_memory`), or the
        planner put the table on tmpfs (class ``tmpfs``) and says so, as ``fio:FILE,cpus=N`` does -- fio's own
        QD1 latency there depends on its engine and the CPUs' idle state (io_uring hands each read of tmpfs to a
        worker thread: a median of 34.6 us on an idle 2-core VM, 5.3 us on the same machine loaded)."""
        return is_memory(self.figs[d["name"]]) or d.get("class") == "tmpfs"

    def entry(self, d: Mapping) -> dict:
        """A device's entry of ``planner.json``: each mode predicted, or why the device was not."""
        entry = {"name": d.get("name"), "class": d.get("class"), "built": bool(d.get("built")),
                 "reason": d.get("reason", ""), "folder": d.get("folder"), "modes": {}, "left_out": {},
                 "fio_file": str(self.files.get(d.get("name"), "")), "datasheet": "", "datasheet_used": "",
                 "datasheet_fallback": "", "today": None}
        if not entry["built"]:
            return entry
        if not d.get("measured"):
            entry.update(built=False, reason=d.get("reason") or "not measured")
            return entry
        folder = self.work / d["folder"]
        entry["today"] = _today(folder, self.today, self.sim_steps, self.seed)
        if d["name"] not in self.files:
            others = sorted(k for k in (d.get("fio") or {}) if k != str(_read_size(d)))
            entry["reason"] = "no fio beside its runs: " + (
                d.get("fio_skipped") or (f"fio recorded at {', '.join(f'fio[{k!r}]' for k in others)}, not at the "
                                         f"engine's read size {_read_size(d)} B ({d['name']}.read_size)"
                                         if others else "not recorded"))
            return entry
        runs_path = folder / "runs.json"
        runs_doc, entry["left_out"] = _planner_runs(load_json(runs_path, "decode_runs"))
        if not runs_doc["runs"]:
            entry["reason"] = "no run a planner can state the compute of"
            return entry
        check_runs(runs_doc, runs_path)
        try:
            _cores(runs_doc)
        except FormatError as exc:
            raise FormatError(f"{runs_path}: {exc}") from None
        spec, fallback, cores = self._describe(entry, d, runs_doc)
        devs = {}
        for mode in MODES:
            got = self._device(entry, d, mode, spec, fallback, cores)
            if got is None:
                self.bar.update(1, note=f"{d['name']} {mode}: refused")
                continue
            dev, described = got
            devs[mode] = dev
            if mode == "datasheet":
                entry["datasheet_used"] = described
            host = self.host(d, mode, runs_doc)
            entry["modes"][mode] = self._predict(d, dev, described, host, runs_doc, runs_path)
            if host is not None:
                note = process_scale(self.profile, "processes")[1]
                entry["modes"][mode]["host_model"] = dict(host.to_dict(), processes=note,
                                                          source=f"{host.source}; {note}")
            mem = (self.profile or engine_profile()).get("memory_read_cpu_us") if self.memory(d) else None
            try:
                host = host_cpu(self.figs[d["name"]], runs_doc, entry["modes"][mode]["rows"], mem)
            except FormatError as exc:
                raise FormatError(f"{runs_path}: {exc}") from None
            if host is not None:
                entry["modes"][mode]["host_cpu"] = host
            self.bar.update(1, note=f"{d['name']} {mode}")
        if "fio" in devs and "datasheet" in devs:
            entry["datasheet_gap"] = datasheet_gap(devs["fio"], devs["datasheet"])
        if d["name"] in self.after_files:
            entry["fio_after"] = self._after(entry, d, runs_doc, runs_path, cores)
        elif d.get("fio_after") or d.get("fio_after_skipped"):
            size = str(_read_size(d))
            entry["fio_after_unused"] = (
                d.get("fio_after_skipped") or
                ("--fio gives the planner's own file for the first prediction" if d["name"] in self.overrides
                 else f"recorded at {', '.join(f'fio_after[{k!r}]' for k in d['fio_after'])}, not at the engine's "
                      f"read size {size} B"))
        return entry

    def _after(self, entry: Mapping, d: Mapping, runs_doc: Mapping, runs_path: Path, cores: Optional[int]) -> dict:
        """The runs of device ``d`` predicted again from the fio taken after them (its file, and the datasheet
        string derived from it as from the first), on the same host but for fio's CPU a read, taken from the
        file after the runs in fio mode (``host_model``: :meth:`host`), and set beside each mode's first prediction
        (:func:`between`): how far the device moved while its runs ran, and where the runs lie between the two."""
        name, throttled = d["name"], d["class"] == "throttled"
        before, after = self.figs[name], self.after_figs[name]
        spec, fallback, _ = datasheet_spec(after, self.raw_after if throttled else None, throttled, cpus=cores,
                                           memory=cores is not None)
        out = {"file": str(self.after_files[name]), "qd1_mean_us": [before["qd1_mean_us"], after["qd1_mean_us"]],
               "peak_iops": [before["peak_iops"], after["peak_iops"]],
               "qd1_held_off": [before.get("qd1_held_off"), after.get("qd1_held_off")], "datasheet": spec,
               "modes": {}}
        for mode, m in entry["modes"].items():
            if m.get("refused") or not m.get("rows"):
                self.bar.update(1, note=f"{name} {mode} (fio after): not predicted before")
                continue
            tries = [self._fio_text(d, str(self.after_files[name]), cores)] if mode == "fio" else \
                [spec] + ([fallback] if fallback else [])
            dev, why = None, ""
            for described in tries:
                try:
                    dev = load_device(described)
                    break
                except ArgumentError as exc:
                    why = f"{why}; then {exc}" if why else str(exc)
            if dev is None:
                out["modes"][mode] = _refused(tries[-1], why)
            else:
                host = self.host(d, mode, runs_doc, after)
                out["modes"][mode] = between(m, self._predict(d, dev, described, host, runs_doc, runs_path))
                if host is not None:
                    out["modes"][mode]["host_model"] = host.to_dict()
                if described != tries[0]:
                    out["modes"][mode]["datasheet_fallback"] = (
                        f"{tries[0]!r} refused by this simulator ({why.split('; keys:')[0]}); predicted from "
                        f"{described!r}, without the volume's rate limit")
            self.bar.update(1, note=f"{name} {mode} (fio after)")
        return out

    def _predict(self, d: Mapping, dev: Device, described: str, host: Optional[HostCPU], runs_doc: Mapping,
                 runs_path: Path) -> dict:
        """A mode's result (:func:`_mode_result`): the runs of device ``d`` predicted from ``dev`` (described by
        ``described``) on ``host``, sessions as processes scaled by the profile, with the planner's goals.  A device
        the planner states memory-backed (:meth:`memory`) is so in either mode: on a host its reads are copies
        (:meth:`sim.decode.host.HostCPU.copy_reads`), whichever figures describe it."""
        derived = getattr(dev, "derived", None)
        if self.memory(d) and isinstance(derived, dict) and "memory_backed" not in derived:
            dev = copy.copy(dev)  # the caller's device keeps its own figures
            dev.derived = {**derived, "memory_backed": {"value": float(_cores(runs_doc)), "rule": "stated by the "
                           "planner: a memory copy in the reading thread, on the runs' machine's CPUs"}}
        doc = crosscheck(PlannerModels.of(dev, described, host, self.profile), runs_doc,
                         runs_path=runs_path, sim_steps=self.sim_steps, seed=self.seed, baseline=False,
                         targets=PLANNER_TARGETS, quiet_targets=PLANNER_TARGETS)
        return _mode_result(doc, described)

    def _fio_text(self, d: Mapping, path: str, cores: Optional[int]) -> str:
        """The device description of fio file ``path`` on device ``d``: ``fio:PATH`` with the engine's read size
        where it is not 4 KiB (a 512-byte sector disk) and the CPUs a memory copy runs on (``cores``), as the
        planner states them; the bare path otherwise."""
        rsize = _read_size(d)
        if rsize == 4096 and cores is None:
            return path
        return (f"fio:{path}" + (f",assume_bs={rsize}" if rsize != 4096 else "") +
                (f",cpus={cores}" if cores is not None else ""))

    def _describe(self, entry: dict, d: Mapping, runs_doc: Mapping) -> tuple:
        """``(datasheet string, its fallback, the CPUs a memory copy runs on or None)`` of a device, with what
        the planner assumes of it put into ``entry``."""
        fig = self.figs[d["name"]]
        cores = _cores(runs_doc) if self.memory(d) else None
        spec, fallback, rules = datasheet_spec(fig, self.raw if d["class"] == "throttled" else None,
                                               d["class"] == "throttled", cpus=cores, memory=cores is not None)
        if cores is not None:
            why = (f"fio's QD1 median {fig['qd1_p50_us']:.1f} us says so" if is_memory(fig) else
                   f"the planner states it (fio's QD1 median, {fig['qd1_p50_us']:.1f} us, is its engine's hand-off "
                   "to a worker thread, not a drive's latency)")
            entry["memory_backed"] = (f"described as memory-backed, fio:FILE,cpus={cores}: a memory copy in the "
                                      f"reading thread, not a drive, as {why}; fio's IOPS are its {fig['jobs']} "
                                      f"job(s)' CPU(s), the runs' readers had {cores} (assumed: the reads scale to "
                                      "them)")
            mem = (self.profile or {}).get("memory_read_cpu_us")
            if mem is not None:
                entry["memory_backed"] += (f"; on the host its reads are copies, {float(mem):.2f} us a read (the "
                                           f"profile's pread from tmpfs), {cores} at once, in both modes: the "
                                           "latencies fio and the datasheet give are not a copy's")
        idle = idle_jobs(read_fio_output(self.files[d["name"]]))
        entry["assumed"] = (f"fio's thinktime job(s) {', '.join(sorted(set(idle)))} left out" if idle else
                            "device measured back-to-back only: no fio job with thinktime") + \
            ", so a slowdown after idle between decode steps is not in the prediction"
        entry.update(datasheet=spec, datasheet_rules=rules)
        return spec, fallback, cores

    def _device(self, entry: dict, d: Mapping, mode: str, spec: str, fallback: str,
                cores: Optional[int]) -> Optional[tuple]:
        """``(device, its description)`` of ``mode`` (``spec``, ``fallback``, ``cores``: :meth:`_describe`'s),
        the datasheet string's fallback where the simulator refuses it; None (the refusal put into ``entry``)
        where it refuses every description."""
        described = self._fio_text(d, str(self.files[d["name"]]), cores) if mode == "fio" else spec
        try:
            return load_device(described), described
        except ArgumentError as exc:
            if not (mode == "datasheet" and fallback):
                entry["modes"][mode] = _refused(described, str(exc))
                return None
            why = str(exc).split("; keys:")[0]
        entry["datasheet_fallback"] = (f"{spec!r} refused by this simulator ({why}); predicted "
                                       f"from {fallback!r}, without the volume's rate limit")
        try:
            return load_device(fallback), fallback
        except ArgumentError as exc2:
            entry["modes"][mode] = _refused(fallback, f"{why}; then {exc2}")
            return None


def datasheet_gap(fio: Device, sheet: Device) -> Optional[dict]:
    """How far a datasheet string's device (``sheet``) runs from the fio file's it was derived from (``fio``): the
    IOPS of each at every depth fio measured (Little's law, :meth:`sim.device.Device.iops`), and the depth where
    they differ most.  Two figures (a QD1 latency, a peak) put a drive's knee at ``IOPS x QD1 latency``; a drive
    whose IOPS climb to their peak over many depths (fio's curve) is not that, and a prediction where the runs
    queue at those depths differs by as much.  A depth where either gives no finite IOPS > 0 is passed over; None
    where none is left.

    Returns
    -------
    dict or None
        ``{"ratio", "qd", "sheet_iops", "fio_iops", "peak_qd", "knee_qd"}``: the largest of ``sheet / fio`` and
        ``fio / sheet`` over the depths, as ``sheet / fio`` at its depth ``qd``; ``peak_qd`` the depth of fio's
        peak among them; ``knee_qd`` the datasheet's knee (its ``derived``; None where it has none).
    """
    pairs = []
    try:
        depths = [int(q) for q in fio.depths() if int(q) >= 1]
    except (ArithmeticError, ValueError, TypeError):
        return None
    for q in depths:
        try:
            a, b = _real(sheet.iops(q)), _real(fio.iops(q))
        except (ArithmeticError, ValueError, TypeError, KeyError):
            continue
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0:
            pairs.append((q, a, b))
    if not pairs:
        return None
    q, a, b = max(pairs, key=lambda p: max(p[1] / p[2], p[2] / p[1]))
    derived = getattr(sheet, "derived", None)
    knee = derived.get("knee_qd") if isinstance(derived, Mapping) else None
    knee = _real(knee.get("value")) if isinstance(knee, Mapping) else None
    return {"ratio": a / b, "qd": q, "sheet_iops": a, "fio_iops": b, "peak_qd": max(pairs, key=lambda p: p[2])[0],
            "knee_qd": knee if knee is not None and math.isfinite(knee) and knee > 0 else None}


def datasheet_notes(entry: Mapping) -> List[str]:
    """A line where a drive's datasheet string runs at least :data:`DATASHEET_GAP` times (or under its inverse)
    fio's IOPS at some depth (``entry["datasheet_gap"]``, :func:`datasheet_gap`); none otherwise, for a
    memory-backed device (its reads are a copy in the reading thread: they do not queue at the device's depths)
    or on a partial document."""
    g = entry.get("datasheet_gap") if isinstance(entry, Mapping) else None
    if not isinstance(g, Mapping) or entry.get("memory_backed"):
        return []
    r, q, a, b, peak = (_real(g.get(k)) for k in ("ratio", "qd", "sheet_iops", "fio_iops", "peak_qd"))
    if any(x is None or not (math.isfinite(x) and 0 < x < 1e12) for x in (r, q, a, b, peak)) or \
            q > MAX_QUEUE_DEPTH or peak > MAX_QUEUE_DEPTH or abs(a / b - r) > 1e-6 * r or \
            not DATASHEET_GAP <= max(r, 1 / r) < 1e6:
        return []  # missing, not a number, or not the figures it says it is: nothing said
    knee = _real(g.get("knee_qd"))
    knee = knee if knee is not None and math.isfinite(knee) and 0 < knee <= MAX_QUEUE_DEPTH else None
    return [f"{entry.get('name')}: the datasheet string runs {r:.2f}x fio's IOPS at QD{q:.0f} ({a:,.0f} against "
            f"{b:,.0f}): its two figures (QD1 latency, peak IOPS" + (f": a knee at QD {knee:.1f}" if knee else "") +
            f") do not follow fio's curve, which peaks at QD{peak:.0f}; where the runs queue at such depths its "
            "predictions differ from fio's as much."]


def between(before: Mapping, after: Mapping) -> dict:
    """A mode's runs predicted from fio before them (``before``: a mode's result, :func:`_mode_result`) and from
    fio after them (``after``): how far apart the two predictions lie, and each run's error against the span
    between them.

    A run measured between the two predictions (its errors of opposite signs, or one of them 0) has an error of 0
    against the span; else the smaller of its two errors, with its sign.  Runs predicted in one and not the
    other, or without a finite error or prediction, are left out.  ``passed``: the span's errors within
    :data:`PLANNER_TARGETS` -- the runs are where a device that moved between the two fio runs could have put
    them; the first prediction's own verdict stands beside it.

    Returns
    -------
    dict
        ``{"device", "tokens_per_s": {"median_abs_error", "max_abs_error"} (the second prediction's own),
        "apart": {"median", "max"} (|second / first - 1| of the predicted tokens/s), "span": {"configurations",
        "median_abs_error", "max_abs_error", "passed"}, "rows": [{"config", "sessions", "mode", "predicted", "error",
        "span_error"}]}``;
        the figures None where no run is left.
    """
    second = {r["config"]: r for r in after.get("rows") or []}
    rows, apart = [], []
    for r in before.get("rows") or []:
        a = second.get(r["config"])
        vals = [r.get("predicted"), r.get("error")] + ([a.get("predicted"), a.get("error")] if a else [])
        if a is None or not all(_real(v) is not None and math.isfinite(v) for v in vals) or r["predicted"] <= 0:
            continue
        eb, ea = float(r["error"]), float(a["error"])
        span = 0.0 if eb * ea <= 0 else (eb if abs(eb) <= abs(ea) else ea)
        apart.append(abs(float(a["predicted"]) / float(r["predicted"]) - 1.0))
        rows.append({"config": r["config"], "sessions": r.get("sessions"), "mode": r.get("mode"),
                     "predicted": float(a["predicted"]), "error": ea, "span_error": span})

    def stats(xs: Sequence[float]) -> tuple:
        return (float(np.median(np.abs(xs))), float(np.max(np.abs(xs)))) if len(xs) else (None, None)

    own, span = stats([r["error"] for r in rows]), stats([r["span_error"] for r in rows])
    gap = stats(apart)
    passed = (span[0] is not None and span[0] <= PLANNER_TARGETS["tokens_per_s_median_abs"]
              and span[1] <= PLANNER_TARGETS["tokens_per_s_max_abs"])
    return {"device": after.get("device"), "refused": after.get("refused", ""),
            "tokens_per_s": {"median_abs_error": own[0], "max_abs_error": own[1]},
            "apart": {"median": gap[0], "max": gap[1]},
            "span": {"configurations": len(rows), "median_abs_error": span[0], "max_abs_error": span[1],
                     "passed": passed},
            "rows": rows}


def after_text(entry: Mapping, mode: str) -> str:
    """The verdict cell's addition for ``mode`` of a device predicted again from fio after its runs (``entry``'s
    ``fio_after``, :meth:`_Planner._after`): the span's verdict and figures and how far the two predictions lie
    apart; "" where there is none.  Never raises on a partial document."""
    fa = entry.get("fio_after") if isinstance(entry, Mapping) else None
    modes = fa.get("modes") if isinstance(fa, Mapping) else None
    m = modes.get(mode) if isinstance(modes, Mapping) else None
    if not isinstance(m, Mapping):
        return ""
    if m.get("refused"):
        return f"; fio after the runs refused: {m['refused']}"
    sp = m.get("span") if isinstance(m.get("span"), Mapping) else {}
    ap = m.get("apart") if isinstance(m.get("apart"), Mapping) else {}
    med, mx = _real(sp.get("median_abs_error")), _real(sp.get("max_abs_error"))
    passed = sp.get("passed") is True
    missed = [f"{what} {v * 100:.2f}% > {PLANNER_TARGETS[key] * 100:g}%" for what, v, key in
              (("median", med, "tokens_per_s_median_abs"), ("max", mx, "tokens_per_s_max_abs"))
              if v is not None and v > PLANNER_TARGETS[key]]
    return (f"; between fio before and after: {'PASS' if passed else 'FAIL'} ("
            + (f"missed: {', '.join(missed)}; " if missed and not passed else "") +
            f"median {_pct(med)}, max {_pct(mx)}; the two predictions {_pct(_real(ap.get('median')))} apart, max "
            f"{_pct(_real(ap.get('max')))})")


def after_notes(entry: Mapping) -> List[str]:
    """Lines on a device predicted again from the fio taken after its runs (``entry["fio_after"]``): how far fio's
    figures moved, then a line per mode (its own errors, the span's verdict: :func:`after_text`); none without
    it.  Never raises on a partial document (a missing figure reads ``?``)."""
    if not isinstance(entry, Mapping):
        return []
    fa = entry.get("fio_after")
    if not isinstance(fa, Mapping):
        why = entry.get("fio_after_unused")
        return [f"{entry.get('name')}: fio after its runs not used: {why}."] if isinstance(why, str) and why else []
    def pair(key: str) -> list:
        v = fa.get(key)
        return v if isinstance(v, list) and len(v) == 2 else [None, None]

    q, p = pair("qd1_mean_us"), pair("peak_iops")
    held = [h if h is not None and 0 <= h < HELD_OFF_SHARE else None for h in map(_real, pair("qd1_held_off"))]
    moved = [max(a / b, b / a) for a, b in (map(_real, q), map(_real, p)) if a and b and a > 0 and b > 0]
    moved = max(moved) if moved else None
    out = [f"{entry.get('name')}: fio again after its runs ({Path(str(fa.get('file'))).name}): QD1 mean "
           f"{_fig(q[0], '.1f')} -> {_fig(q[1], '.1f')} us, peak {_fig(p[0], ',.0f')} -> {_fig(p[1], ',.0f')} IOPS; "
           "each run is also judged against the span between the predictions from the two" +
           (f"; the device moved {moved:.1f}-fold between them: a prediction from either file holds only while the "
            "device stays as that fio run found it" if moved is not None and moved >= MOVED_FOLD else "") +
           "".join(f"; fio {when} the runs: {held_off_text(h)}" for when, h in zip(("before", "after"), held)
                   if h is not None) + "."]
    modes = fa.get("modes") if isinstance(fa.get("modes"), Mapping) else {}
    for mode, m in modes.items():
        if not isinstance(m, Mapping):
            continue
        if m.get("refused"):
            out.append(f"{entry.get('name')} {mode} (fio after the runs): refused: {m['refused']}.")
            continue
        t = m.get("tokens_per_s") if isinstance(m.get("tokens_per_s"), Mapping) else {}
        fell = m.get("datasheet_fallback")
        fell = " ".join(fell.split()) if isinstance(fell, str) else ""
        out.append(f"{entry.get('name')} {mode} (fio after the runs): predicted from it: median abs error "
                   f"{_pct(_real(t.get('median_abs_error')))}, max {_pct(_real(t.get('max_abs_error')))}{_worst(m)};"
                   f"{after_text(entry, mode)[1:]}" + (f"; {fell}" if fell else "") + ".")
    return out


def _classes(entries: Sequence[Mapping]) -> dict:
    """Per device class and mode: the configurations' tokens/s errors pooled over the class's devices."""
    out: Dict[str, dict] = {}
    for e in entries:
        for mode, m in list(e["modes"].items()) + ([("windows", e["today"])] if e.get("today") else []):
            if not m or not m.get("rows"):
                continue
            c = out.setdefault(e["class"], {}).setdefault(mode, {"errors": [], "capacity": [], "devices": []})
            c["errors"] += [r["error"] for r in m["rows"]]
            c["devices"].append(e["name"])
            c["capacity"] += [dict(x, device=e["name"]) for x in m.get("capacity") or []]
    for cls in out.values():
        for mode, c in cls.items():
            e = np.abs(np.array(c.pop("errors")))
            c.update(configurations=int(e.size), median_abs_error=float(np.median(e)), max_abs_error=float(e.max()))
    return out


def host_notes(entry: Mapping) -> List[str]:
    """A line per mode of a device's ``planner.json`` entry whose configurations :func:`host_cpu` found
    host-bound: which, their shares, and the errors of the others; where the mode modelled the host
    (``host_model``: :mod:`sim.decode.host`) its predictions there are the host's, else upper bounds.  An
    older document without ``host_cpu`` gives none; a figure missing from a partial one reads ``?``."""
    out = []
    modes = entry.get("modes") if isinstance(entry, Mapping) else None
    for mode, m in (modes.items() if isinstance(modes, Mapping) else ()):
        h = m.get("host_cpu") if isinstance(m, Mapping) else None
        if not isinstance(h, Mapping) or not isinstance(h.get("bound"), list) or not h["bound"]:
            continue
        shares = h.get("shares") if isinstance(h.get("shares"), Mapping) else {}
        hm = m.get("host_model")
        f = h.get("free") if isinstance(h.get("free"), Mapping) else None
        n = f.get("configurations") if f else None
        src = h.get("cpu_source") if isinstance(h.get("cpu_source"), str) else "fio's"  # older documents: fio's
        out.append(f"{entry.get('name')} {mode}: host-bound (the predicted reads take >= "
                   f"{_fig(h.get('bound_share'), 'g')} of the {_fig(h.get('cores'), 'd')} CPU(s) at "
                   f"{src} "
                   f"{_fig(h.get('cpu_per_read_us'), '.1f')} us a read): "
                   + ", ".join(f"{k} ({_fig(shares.get(k), '.2f')} of them)" for k in h["bound"])
                   + (f": predicted on the host ({hm.get('source') or '?'})" if isinstance(hm, Mapping) else
                      ": upper bounds") + "; the other configurations: "
                   + (f"{_fig(n, 'd')}, median abs error {_pct(_real(f.get('median_abs_error')))}, max "
                      f"{_pct(_real(f.get('max_abs_error')))}." if f else "none."))
    return out


def _real(x) -> Optional[float]:
    """``x`` as a float when it is a real number (not a bool) a float can hold, else None."""
    if not isinstance(x, Real) or isinstance(x, bool):
        return None
    try:
        return float(x)
    except OverflowError:  # an integer past a float's range (JSON allows one)
        return None


def _fig(x, spec: str) -> str:
    """``x`` formatted by ``spec`` (``"d"``: a whole number), ``?`` where it is not a number of that kind."""
    if spec == "d":
        return f"{int(x)}" if isinstance(x, Integral) and not isinstance(x, bool) else "?"
    v = _real(x)
    return "?" if v is None else format(v, spec)


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _cell(x) -> str:
    """``x`` as a cell of a Markdown table: ``|`` escaped (``\\|``, which GitHub's tables read as the character,
    within code spans too) and a control character shown as a space, so the row keeps its columns and its line."""
    return _plain(str(x)).replace("|", "\\|")


def markdown_table(res: Mapping) -> str:
    """The planner cross-check as Markdown: a row per device and description (fio, datasheet, and today's
    windowed cross-check beside them), the capacity, and which devices were built and skipped.

    Every cell's text goes through :func:`_cell`: a ``|`` (a device name may hold one, as a fio file's name or a
    refusal) is escaped; devices.json's names cannot hold a control character (:func:`check_devices`), and
    any other text's is shown as a space, in the cells and in the lines after the tables (:func:`_plain`)."""
    lines = ["| device | class | predicted from | configurations | tokens/s median abs error | max | capacity "
             "measured / predicted | regime | verdict |", "|" + "---|" * 9]
    for e in res["devices"]:
        if not e["built"]:
            continue
        shown = list(e["modes"].items()) + ([("today (windows)", e["today"])] if e.get("today") else [])
        for mode, m in shown:
            if not isinstance(m, Mapping):
                continue
            name, cls = _cell(e["name"]), _cell(e["class"])
            if m.get("refused"):
                lines.append(f"| {name} | {cls} | {_cell(mode)}: `{_cell(m['device'])}` | - | refused: "
                             f"{_cell(m['refused'])} | | | | |")
                continue
            s = m["summary"]
            t = s.get("tokens_per_s") or {}
            caps = "; ".join(f"{c['mode']} {'>= ' if c['all_met']['measured'] else ''}{c['measured_capacity']} / "
                             f"{'>= ' if c['all_met']['predicted'] else ''}{c['predicted_capacity']}"
                             f"{'' if c['within_one_step'] else ' (NOT within one step)'}" for c in m["capacity"]) \
                or "-"
            targets = sorted({c.get("target_tokens_per_s") for c in m["capacity"]} - {None})
            if targets:
                caps += f" (at {', '.join(f'{t:g}' for t in targets)} tokens/s)"
            rg = (s.get("regime") or {}).get("name", "?")
            what = m["device"] if mode != "fio" else Path(m["device"]).name
            lines.append(f"| {name} | {cls} | {_cell(mode)}: `{_cell(what)}` | {_cell(s.get('configurations', 0))} | "
                         f"{_pct(t.get('median_abs_error'))} | {_pct(t.get('max_abs_error'))}{_worst(m)} | "
                         f"{_cell(caps)} | "
                         f"{_cell(rg)} | {_cell(verdict_text(s) + after_text(e, mode))} |")
    lines += ["", "| class | predicted from | devices | configurations | median abs error | max |",
              "|" + "---|" * 6]
    for cls, modes in res["classes"].items():
        for mode, c in modes.items():
            lines.append(f"| {_cell(cls)} | {_cell(mode)} | {_cell(', '.join(c['devices']))} | "
                         f"{_cell(c['configurations'])} | {_pct(c['median_abs_error'])} | {_pct(c['max_abs_error'])} |")
    lines.append("")
    tables = len(lines)
    lines.append(f"Goals a device and description: tokens/s median |error| <= "
                 f"{_pct(PLANNER_TARGETS['tokens_per_s_median_abs'])}, max <= "
                 f"{_pct(PLANNER_TARGETS['tokens_per_s_max_abs'])}, the measured capacity within one step of the "
                 "session grid of the predicted one; an error is predicted / measured - 1 (too fast: above the "
                 "measurement). Each run is predicted at its own configuration (trace, compute, readers: its name in "
                 "planner.json), as is each capacity.")
    lines.append("Devices built: " + (", ".join(res["built"]) or "none") + ".")
    if res["skipped"]:
        lines.append("Skipped: " + "; ".join(f"{n} ({why})" for n, why in res["skipped"].items()) + ".")
    left: Dict[str, str] = {}
    for e in res["devices"]:
        left.update(e.get("left_out") or {})
    for k, why in left.items():
        lines.append(f"Left out of planner mode: {k}: {why}.")
    for e in res["devices"]:
        if e.get("datasheet_fallback"):
            lines.append(f"{e['name']}: {e['datasheet_fallback']}.")
        if e.get("memory_backed"):
            lines.append(f"{e['name']}: {e['memory_backed']}.")
        if e.get("assumed"):
            lines.append(f"{e['name']}: {e['assumed']}.")
        lines += datasheet_notes(e)
        lines += after_notes(e)
        lines += host_notes(e)
        if e["built"] and e.get("reason"):
            lines.append(f"{e['name']}: {e['reason']}.")
    return "\n".join(lines[:tables] + [_plain(x) for x in lines[tables:]])


def _plain(text: str) -> str:
    """``text`` on one line: a control character (a newline, an escape) shown as a space -- a reason or a fio
    message of devices.json is the measurement's free text."""
    return "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
