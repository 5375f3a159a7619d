"""A device from fio's own output: ``fio --output-format=json``, one run or several, at several iodepths.

Each read job of the output is a closed loop of ``iodepth`` outstanding
reads -- what :class:`~sim.device.models.EmpiricalDevice` tabulates by queue
depth.  Per job: the queue depth is ``iodepth`` (job option, else global
option, else 1) times ``numjobs`` when ``group_reporting`` merged the clones
(clones reported one by one, under one job name and one depth of one run, ran
together: their depths and IOPS add up; :func:`fio_records`); the mean latency
is ``read.lat_ns.mean`` (submission + completion; ``depth / iops`` by Little's
law when absent); the
distribution runs from fio's minimum through every percentile it printed to
its maximum -- ``read.lat_ns``'s when fio ran with ``lat_percentiles=1``, else
``read.clat_ns``'s shifted by the mean submission latency -- and is scaled to
the measured mean: fio's percentiles are the upper bounds of its histogram
buckets, so the quantile function through them runs a little high (1-3% on
the fixture of the tests).  Several measurements of one depth
(several runs in one file, or several files) are combined by the median of
each figure.

Runs must not overlap: run the depths one after the other (``stonewall``
between jobs, or one run per depth, concatenated in one file).

Read size and direction
    The engine reads a row as one aligned 4 KiB block (SPEC §8), so fio must
    have read 4 KiB blocks: the block size is the bytes read over the reads
    (``read.io_bytes / read.total_ios``, else the ``bs`` option).  Output of
    another block size is refused (one line), unless the caller states the
    assumption (``assume_bs``, ``fio:FILE,assume_bs=16k``): then the figures
    are taken as they are, and ``derived`` says so.  A job that wrote or
    trimmed is refused: its reads met a device busy with its writes.

The measured peak as a bound
    A device from fio never exceeds the peak IOPS it measured:
    :class:`~sim.device.models.EmpiricalDevice` with ``peak_bound`` (a token
    bucket of the peak, as deep as the deepest depth measured).

A rate-limited volume, recognised
    A throttled or provisioned volume (cgroup blkio/io.max, a cloud volume)
    shows two things in fio's own figures: IOPS flat from the first depth
    that reaches the peak to the deepest (:data:`FLAT_IOPS`: within 10%, at
    least two depths), and at queue depth 1 a median latency far below the
    mean (:data:`MEDIAN_OVER_MEAN`: below half), because most reads pass at
    the raw device's speed and a few wait for the throttle's next grant --
    or at a deeper depth of the flat run, where a cap near the raw QD1 rate
    makes few reads wait at depth 1 (fio on a 15,000-IOPS throttle of a
    19,000-IOPS disk: 0.61 at depth 1, 0.22 at depth 2).
    Such output becomes a :class:`~sim.device.models.RateLimitedDevice`:

    - ``cap_iops``: the median of fio's ``read.iops`` over the flat depths;
    - the raw device: at each depth, fio's quantile function below the
      throttle's wait -- up to the last percentile within
      :data:`WAIT_FACTOR` (4x) of that depth's median -- stretched to the whole
      ``[0, 1]`` (the reads that did not wait);
    - ``burst_ios``: a throttle granting ``b`` tokens every ``b / cap``
      seconds makes the read that finds them spent wait ``W = b (1 / cap -
      1 / R)`` at a depth whose raw rate ``R`` exceeds the cap; ``W`` is fio's
      maximum latency there (the shallowest such depth), so ``b = W / (1 /
      cap - 1 / R)``; with no such depth, ``cap x 0.1 s`` (assumed: the Linux
      block throttle's slice, :data:`sim.device.datasheet.THROTTLE_SLICE`).

A memory-backed device, recognised
    tmpfs or a page-cache hit reads by copying memory in the reading thread:
    a QD1 median latency below :data:`MEMORY_QD1_P50` (15 us) says so, and
    ``derived`` does (``memory_backed``).  fio's IOPS there are the copy rate
    of the CPUs its jobs ran on (one a job), not a device's: the engine's
    readers copy on as many CPUs as they get.  ``fio:FILE,cpus=N`` states the
    CPUs the readers will have: the ``N / jobs`` times as many reads in flight
    see the latency fio measured at each depth (a read at depth ``q x N /
    jobs`` takes what one took at ``q``; up to ``N / jobs`` reads at once take
    the QD1 latency), so the peak scales by ``N / jobs`` -- an assumption,
    said in ``derived``.  Without ``cpus`` the figures are taken as they are
    (``derived`` says that they are one CPU's a job).  On a host the decode
    model takes its reads as the host's copies instead
    (:meth:`sim.decode.host.HostCPU.copy_reads`).

    Every figure derived, and the rule, is in the device's ``derived``.

After an idle spell (not modelled; :func:`idle_jobs`)
    A device measured back-to-back never shows a slowdown after the idle
    time between decode steps.  fio on this project's development VM disk
    (4 KiB random direct reads, QD4, ``thinktime_blocks=48``, 2026-12-02):
    back-to-back 79.5-92.1 us mean, after 5 ms idle 102.5-106.5 us; the
    per-read log puts the extra 30-40 us on the first queue depth's reads of
    each burst, the rest at the back-to-back rate.  An earlier quiet run of
    the same pair gave 81.3 vs 180.2 us: the penalty's size moved 4x within
    hours, so no wake-up figure is fitted from fio: thinktime jobs are left
    out of the latency by depth (``derived["idle_jobs"]`` names them), and the
    planner states either that or "device measured back-to-back only"
    (benchmarks/BENCHMARKS.md has the full sweep).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.io import read_text
from sim.core.limits import MAX_QUEUE_DEPTH
from sim.core.schema import LATENCY, check_number
from .latency import LatencyDist
from .models import Device, EmpiricalDevice, RateLimitedDevice

__all__ = ["ENGINE_READ_BYTES", "FLAT_IOPS", "HELD_OFF_SHARE", "HOST_BOUND_SHARE", "MAX_READ_CPU_S",
           "MEDIAN_OVER_MEAN", "MEMORY_QD1_P50", "WAIT_FACTOR",
           "cpu_held_off", "cpu_per_read", "device_from_fio", "fio_records", "held_off_text", "idle_jobs",
           "in_flight_share", "is_fio_output", "parse_block_size", "rate_limit_of", "read_fio_output"]

_NS = 1e-9
#: The engine's read: one aligned 4 KiB block a row (SPEC §8), bytes.
ENGINE_READ_BYTES = 4096
#: IOPS within this share of the peak count as flat (a rate limit's plateau).
FLAT_IOPS = 0.10
#: A median below this share of its depth's mean is "far below" (most reads pass, a few wait long).
MEDIAN_OVER_MEAN = 0.5
#: A latency above this many times its depth's median is a read that waited for the throttle.
WAIT_FACTOR = 4.0
#: The Linux block throttle's slice, seconds (block/blk-throttle.c, ``DFL_THROTL_SLICE_HD = HZ / 10``).
THROTTLE_SLICE = 0.1
#: A QD1 median latency below this (seconds) is a memory copy, not a drive's read: the fastest flash reads a
#: 4 KiB block in about 40-80 us at QD1, tmpfs or the page cache in a few microseconds.
MEMORY_QD1_P50 = 15e-6


def parse_block_size(text: str) -> int:
    """Bytes of a fio block size (``4k``, ``4096``, ``16KiB``, ``1m``; fio's ``kb_base=1024``); the read size of
    ``bs=READ,WRITE``.

    Raises
    ------
    ArgumentError
        Not a block size (names it).
    """
    t = str(text).split(",")[0].strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    try:
        v = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except ValueError:
        raise ArgumentError(f"block size {text!r} is not a size (e.g. 4k, 4096, 16KiB)") from None
    if not (v >= 512 and v == int(v) and v <= 1 << 30):
        raise ArgumentError(f"block size {text!r} is outside [512 B, 1 GiB]")
    return int(v)


def is_fio_output(text: str) -> bool:
    """True when ``text`` holds fio JSON output (its ``"fio version"`` key)."""
    return '"fio version"' in text


def read_fio_output(path: Union[str, os.PathLike]) -> List[dict]:
    """The JSON documents of a fio output file (one per run; text fio printed around them is skipped).

    Raises
    ------
    FormatError
        Unreadable, or no fio JSON document in it (names the file).
    """
    path = Path(path)
    text = read_text(path, "fio output")
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        j = text.find("{", i)
        if j < 0:
            break
        try:
            obj, end = dec.raw_decode(text, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        except RecursionError:
            raise FormatError(f"{path}: the JSON at byte {j} is nested too deep to read") from None
        if isinstance(obj, dict) and "fio version" in obj:
            docs.append(obj)
        i = end
    if not docs:
        raise FormatError(f"{path}: no fio JSON output in it (run fio with --output-format=json)")
    return docs


def _obj(parent: dict, key: str, path: str) -> dict:
    """``parent[key]`` if it is a JSON object, ``{}`` if absent or null.

    Raises
    ------
    FormatError
        Present and not an object (names the JSON path ``path`` and the value).
    """
    v = parent.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise FormatError(f"{path}: expected a JSON object, got {_shown(v)}")
    return v


def _num(v, path: str) -> float:
    """``v`` as a finite float >= 0 (a count, a rate or a latency of fio's).

    Raises
    ------
    FormatError
        Not a number, not finite or negative (names the JSON path and the value).
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FormatError(f"{path}: expected a number, got {_shown(v)}")
    try:
        x = float(v)
    except OverflowError:  # an integer past a float's range
        x = math.inf if v > 0 else -math.inf
    if not (math.isfinite(x) and x >= 0):
        raise FormatError(f"{path}: expected a finite number >= 0, got {_shown(v) if isinstance(v, int) else f'{x:g}'}")
    return x


def _latency(v, where: str, key: str) -> float:
    """``v`` (ns) as a float: a latency of fio's, a finite number > 0 (:data:`sim.core.schema.LATENCY`; names
    the JSON path ``where.key`` and the value)."""
    return check_number(where, key, v, LATENCY)


def _shown(v) -> str:
    text = json.dumps(v) if not isinstance(v, float) else f"{v:g}"
    return text if len(text) <= 40 else text[:37] + "..."


def _opt(job: dict, glob: dict, key: str, default: str, where: str) -> str:
    return str(_obj(job, "job options", f"{where}[\"job options\"]").get(key, glob.get(key, default)))


def _set(job: dict, glob: dict, key: str) -> bool:
    """The job ran with option ``key`` set to a nonzero value (its own option, else the global one)."""
    opts = job.get("job options") if isinstance(job.get("job options"), dict) else {}
    return re.sub(r"[^0-9.]", "", str(opts.get(key, glob.get(key, "0"))).strip()) not in ("", "0", "0.0")


def _thinktime(job: dict, glob: dict) -> bool:
    """The job ran with a nonzero ``thinktime`` (its own option, else the global one): an idle pattern."""
    return _set(job, glob, "thinktime")


def _paced(job: dict, glob: dict) -> bool:
    """The job ran at a set rate (``rate``, ``rate_iops`` or ``rate_min``, its own option or the global one): an open
    loop that leaves its slots empty between reads on purpose."""
    return any(_set(job, glob, key) for key in ("rate", "rate_iops", "rate_min"))


def idle_jobs(docs: Sequence[dict]) -> List[str]:
    """Names of the jobs in fio JSON ``docs`` (:func:`read_fio_output`) that ran with a nonzero ``thinktime``
    (job or global option): an idle pattern, not back-to-back reads.  They are left out of a device's
    latency by depth (:func:`fio_records`), and said so in its ``derived``: the after-idle slowdown is not
    modelled (see the module).  An empty list: the device was measured back-to-back only, which the planner
    states as an assumption (benchmarks/BENCHMARKS.md, "The plain disk after an idle spell")."""
    out = []
    for doc in docs:
        glob = doc.get("global options") if isinstance(doc.get("global options"), dict) else {}
        for job in doc.get("jobs") or []:
            if isinstance(job, dict) and _thinktime(job, glob):
                out.append(str(job.get("jobname", "?")))
    return out


#: The most CPUs a job's ``usr_cpu + sys_cpu`` may say it kept busy (as ``device_from_fio``'s ``cpus``): past it
#: the shares are not fio's.
MAX_JOB_CPUS = 4096
#: The most CPU one read may take by fio's figures, seconds (:func:`cpu_per_read`): a read's system call and
#: completion take microseconds, a memory copy of the largest block fio is taken at (1 GiB) well under a second;
#: past it the figures are off (a run time or a share mistyped), and the host model would be handed a read
#: longer than any step it takes (:class:`sim.decode.host.HostCPU`).
MAX_READ_CPU_S = 1.0


def _job_figures(job, glob: dict, where: str) -> dict:
    """One read job's depth, IOPS, mean latency and percentiles (seconds); ``where`` is its JSON path.  ``cpu_s``,
    the CPU seconds its reads took, is None without ``usr_cpu``, ``sys_cpu`` and ``job_runtime``, or where they
    make no CPU time (a run time of 0: fio leaves the shares at 0 then).

    Raises
    ------
    FormatError
        A field of the wrong type, a negative or non-finite figure, a percentile that is not a number, CPU shares
        past :data:`MAX_JOB_CPUS` CPUs (names the JSON path and the value), CPU a read past :data:`MAX_READ_CPU_S`
        (names the JSON path, the job, its depth and the figure).
    """
    if not isinstance(job, dict):
        raise FormatError(f"{where}: expected a JSON object, got {_shown(job)}")
    r = _obj(job, "read", f"{where}.read")
    ios = _num(r.get("total_ios", 0), f"{where}.read.total_ios")
    iops = _num(r.get("iops", 0), f"{where}.read.iops")
    if not ios or not iops:
        return {}
    iodepth, numjobs = _opt(job, glob, "iodepth", "1", where), _opt(job, glob, "numjobs", "1", where)
    try:
        depth, clones = int(iodepth), int(numjobs)
    except ValueError as exc:
        raise FormatError(f"{where}: job {job.get('jobname')!r}: bad iodepth or numjobs ({exc})") from None
    jobs = 1
    if "group_reporting" in _obj(job, "job options", f"{where}[\"job options\"]") or "group_reporting" in glob:
        depth *= clones
        jobs = clones
    lat, clat = _obj(r, "lat_ns", f"{where}.read.lat_ns"), _obj(r, "clat_ns", f"{where}.read.clat_ns")
    rd = f"{where}.read"
    mean = _latency(lat["mean"], rd, "lat_ns.mean") * _NS if "mean" in lat else depth / iops
    src = "read.lat_ns"
    if "mean" in clat and "mean" in lat and _latency(clat["mean"], rd, "clat_ns.mean") * _NS > mean * (1 + 1e-6):
        raise FormatError(f"{rd}.clat_ns.mean = {clat['mean']:g} ns is above lat_ns.mean = {lat['mean']:g} ns: "
                          "fio's total latency (lat) is submission plus completion (clat), never less")
    if lat.get("percentile"):
        pct, shift, ends, at = _obj(lat, "percentile", f"{where}.read.lat_ns.percentile"), 0.0, lat, "lat_ns"
    else:
        src = "read.clat_ns + mean submission latency"
        pct = _obj(clat, "percentile", f"{where}.read.clat_ns.percentile")
        cmean = _latency(clat["mean"], rd, "clat_ns.mean") * _NS if "mean" in clat else mean
        if cmean > mean * (1 + 1e-6):
            raise FormatError(f"{rd}.clat_ns.mean = {clat['mean']:g} ns is above the mean latency the job's IOPS give "
                              f"at depth {depth} ({mean * 1e9:.0f} ns, Little's law: read.lat_ns has no mean): a "
                              "completion cannot take longer than the whole read")
        shift, ends, at = mean - cmean, clat, "clat_ns"
    lo = _latency(ends["min"], rd, f"{at}.min") * _NS + shift if "min" in ends else None
    hi = _latency(ends["max"], rd, f"{at}.max") * _NS + shift if "max" in ends else None
    pcts = {}
    for p, v in pct.items():
        ppath = f"{where}.read.{at}.percentile[{json.dumps(p)}]"
        try:
            u = float(p)
        except ValueError:
            raise FormatError(f"{ppath}: the key is not a percentile (a number in (0, 100))") from None
        if 0 < u < 100:
            pcts[u] = _latency(v, rd, f"{at}.percentile[{json.dumps(p)}]") * _NS + shift
    wr = _obj(job, "write", f"{where}.write")
    tr = _obj(job, "trim", f"{where}.trim")
    writes = _num(wr.get("total_ios", 0), f"{where}.write.total_ios") + \
        _num(tr.get("total_ios", 0), f"{where}.trim.total_ios")
    io_bytes = _num(r["io_bytes"], f"{where}.read.io_bytes") if "io_bytes" in r else None
    cpu_s = None
    if all(k in job for k in ("usr_cpu", "sys_cpu", "job_runtime")):
        # fio's CPU shares are of the job's run time (summed over a group's jobs with group_reporting, as is
        # job_runtime), so their product is the CPU seconds the job's reads took
        share = _num(job["usr_cpu"], f"{where}.usr_cpu") + _num(job["sys_cpu"], f"{where}.sys_cpu")
        runtime = _num(job["job_runtime"], f"{where}.job_runtime")
        if share > 100 * MAX_JOB_CPUS:
            raise FormatError(f"{where}: usr_cpu + sys_cpu = {share:g}%: more than {MAX_JOB_CPUS} CPUs busy all "
                              "the job's run time (fio's shares are percent of one CPU)")
        cpu_s = share / 100 * runtime * 1e-3
        if cpu_s == 0:
            cpu_s = None  # no run time (fio leaves the shares at 0 then) or no CPU time: no CPU figure
        elif cpu_s / ios > MAX_READ_CPU_S:
            raise FormatError(f"{where} (job {str(job.get('jobname', '?'))!r}, depth {depth}): (usr_cpu + sys_cpu) x "
                              f"job_runtime / read.total_ios = {cpu_s / ios:.3g} s of CPU a read: more than "
                              f"{MAX_READ_CPU_S:g} s (fio's CPU figures are off)")
    return {"qd": depth, "jobs": jobs, "iops": iops, "mean": mean, "pct": pcts, "lo": lo, "hi": hi, "writes": writes,
            "ios": ios, "cpu_s": cpu_s,
            "read_bytes": io_bytes / ios if io_bytes else None, "where": where,
            "rw": _opt(job, glob, "rw", "?", where), "bs": _opt(job, glob, "bs", "4k", where),
            "ioengine": _opt(job, glob, "ioengine", "?", where), "name": str(job.get("jobname", "?")),
            "pct_from": src, "paced": _paced(job, glob)}


def fio_records(docs: Sequence[dict], where: str = "fio output") -> List[dict]:
    """Per read job (clones of one run merged): ``{"qd", "iops", "mean", "pct", "rw", "bs", "ioengine"}``;
    jobs that ran with a ``thinktime`` are left out (:func:`idle_jobs`).

    Clones are the jobs of one name *and one depth* in one run (one document): fio reports the ``numjobs``
    clones of a job one by one (without ``group_reporting``) under the job's name, each with the job's options,
    its ``iodepth`` too; they ran together, so their depths, IOPS, reads and CPU add up.  Jobs of one name at
    different depths in one run are different jobs (sections of one name: ``fio --name=rr --iodepth=1
    --name=rr --iodepth=4``), each a record at its own depth -- merged by name alone they became one job at the
    depths' sum, a depth never run.  Jobs of different runs never merge: fio's output of one run a depth names
    its job the same in each, and two runs at one depth are two measurements of it, combined by their medians
    (:func:`device_from_fio`).  Jobs of one name and one depth in one run are taken as clones: run a repeat
    of a depth as its own run, or name it apart.

    Raises
    ------
    FormatError
        A document without jobs, no read job at all, or a field of the wrong type or range (names its JSON
        path, e.g. ``jobs[0].read.clat_ns.percentile["99.000000"]``, and the value).
    """
    out, idle = [], 0
    for di, doc in enumerate(docs):
        jobs = doc.get("jobs")
        if not isinstance(jobs, list):
            raise FormatError(f"{where}: run {di} has no 'jobs' list")
        run = f"{where}: " + (f"run {di}: " if len(docs) > 1 else "")
        glob = _obj(doc, "global options", f'{run}"global options"')
        clones: Dict[tuple, List[dict]] = {}  # (job name, depth) -> the jobs of this run (see above)
        for ji, job in enumerate(jobs):
            if isinstance(job, dict) and _thinktime(job, glob):
                idle += 1
                continue  # an idle pattern, not latency by depth (idle_jobs)
            f = _job_figures(job, glob, f"{run}jobs[{ji}]")
            if f:
                clones.setdefault((f["name"], f["qd"]), []).append(f)
        for group in clones.values():
            if len(group) == 1:
                out.append(group[0])
                continue
            keys = set.intersection(*(set(g["pct"]) for g in group))
            out.append(dict(group[0], qd=sum(g["qd"] for g in group), iops=sum(g["iops"] for g in group),
                            jobs=sum(g.get("jobs", 1) for g in group), ios=sum(g["ios"] for g in group),
                            cpu_s=(None if any(g["cpu_s"] is None for g in group) else
                                   sum(g["cpu_s"] for g in group)),
                            mean=float(np.mean([g["mean"] for g in group])),
                            pct={p: float(np.median([g["pct"][p] for g in group])) for p in keys}))
    if not out:
        raise FormatError(f"{where}: no read job with completed reads" + (
            f" run back to back ({idle} ran with a thinktime: an idle pattern, not latency by depth)" if idle else ""))
    return out


#: The share of the host's CPUs the predicted reads take by fio's own CPU per read
#: (:func:`sim.check.planner.host_cpu`) from which the host, not the drive, is taken to bind: fio's figure leaves
#: out the engine's own work on the same CPUs (hash, decode, its threads), so the host runs out before the reads
#: alone fill it.  Measured on a 2-CPU VM at 512-byte reads (BENCHMARKS.md, issue 23): configurations at shares
#: of 0.36 and below were predicted within +4-9%, those at 0.68 and above +24-67% too fast.
HOST_BOUND_SHARE = 0.5


#: The share of a job's run time that each of its slots held a read in flight (:func:`in_flight_share`) below
#: which the job was held off its CPU: a closed loop of reads keeps a read in flight all but fio's own few
#: microseconds a read (0.97-1.00 in every fio run of BENCHMARKS.md's measurements, disk, throttles and tmpfs, at
#: every depth), so a lower share is time the job waited to run -- other load on its CPUs.  One QD1 run of a
#: quiet 2-core VM's disk read 0.49, and its CPU a read was 26.0 us where the runs before and after it gave
#: 19.6-21.9 us.
HELD_OFF_SHARE = 0.9


def in_flight_share(rec: Mapping) -> float:
    """The share of a job's run time that each of its ``qd`` slots held a read in flight, by Little's law: IOPS x
    mean latency / depth (a :func:`fio_records` record); about 1 for a closed loop that ran undisturbed, below
    :data:`HELD_OFF_SHARE` where the job waited for its CPU (a job run at a set rate, ``paced`` in its record,
    leaves its slots empty on purpose: :func:`cpu_held_off` does not count it held off)."""
    return float(rec["iops"]) * float(rec["mean"]) / max(1, int(rec["qd"]))


def _cpu_runs(recs: Sequence[dict]) -> tuple:
    """``(runs at the lowest depth with CPU figures, those of them not held off their CPU)``."""
    if not recs:
        return [], []
    low = min(r["qd"] for r in recs)
    runs = [r for r in recs if r["qd"] == low and r.get("cpu_s") is not None and r.get("ios")]
    return runs, [r for r in runs if r.get("paced") or in_flight_share(r) >= HELD_OFF_SHARE]


def cpu_per_read(recs: Sequence[dict]) -> Optional[float]:
    """The CPU one read took in fio's jobs at their lowest queue depth, seconds: ``(usr_cpu + sys_cpu) / 100 x
    job_runtime / read.total_ios`` (the median over that depth's runs; :func:`fio_records`' records), None when
    fio's JSON has no CPU figures.  At the lowest depth (QD1) each read waits for its completion, as each of the
    engine's pread readers does, so the figure holds the kernel's read path and a sleep and a wake-up; it leaves
    out the engine's own work on the host (hash, decode, its threads).  Runs held off their CPU
    (:func:`cpu_held_off`) are left out where a run at that depth was not; where all were, they are taken."""
    runs, clean = _cpu_runs(recs)
    per = [r["cpu_s"] / r["ios"] for r in (clean or runs)]
    return float(np.median(per)) if per else None


def cpu_held_off(recs: Sequence[dict]) -> Optional[float]:
    """The median in-flight share (:func:`in_flight_share`) of the runs :func:`cpu_per_read` took, where it is
    below :data:`HELD_OFF_SHARE` -- every run at the lowest depth waited for its CPU, so the CPU a read was
    measured under other load on the host (its caches and run queue), not the read path's own; None otherwise."""
    runs, clean = _cpu_runs(recs)
    if clean or not runs:
        return None
    return float(np.median([in_flight_share(r) for r in runs]))


def held_off_text(share: float, depth: int = 1) -> str:
    """What a held-off ``share`` (:func:`cpu_held_off`: a fraction in [0, 1) of the job's run time) says of fio's
    CPU a read at queue depth ``depth``, as a clause of a figure's rule (a string; raises nothing)."""
    return (f"fio's QD{depth} job had a read in flight {share:.0%} of its run time (IOPS x mean latency; an "
            f"undisturbed run has {HELD_OFF_SHARE:.0%} or more): it waited for its CPU, so its CPU a read was taken "
            "under other load and is likely high; run fio on a quiet host")


def _dist(rs: Sequence[dict], where: str) -> LatencyDist:
    """One depth's distribution from its measurements (medians): minimum, percentiles, maximum, scaled to
    the mean."""
    keys = set.intersection(*(set(r["pct"]) for r in rs))
    mean = float(np.median([r["mean"] for r in rs]))
    if not keys:
        return LatencyDist.point(mean)
    ps = sorted(keys)
    vs = [float(np.median([r["pct"][p] for r in rs])) for p in ps]
    u, q = [p / 100 for p in ps], vs
    if all(r["lo"] is not None for r in rs) and all(r["hi"] is not None for r in rs):
        u, q = [0.0] + u + [1.0], [float(np.median([r["lo"] for r in rs]))] + q + \
            [float(np.median([r["hi"] for r in rs]))]
    else:
        u, q = [0.0] + u + [1.0], [q[0]] + q + [q[-1]]
    q = np.maximum.accumulate(np.maximum(np.asarray(q), 0.0))
    try:
        d = LatencyDist(u, q)
    except ArgumentError as exc:
        raise FormatError(f"{where}: {exc}") from None
    return LatencyDist(d.u, d.q * (mean / d.mean)) if d.mean > 0 else d


def _check_reads(recs: Sequence[dict], assume_bs, where: str) -> dict:
    """Refuse jobs that wrote, and (unless assumed) a block size other than the engine's; returns ``derived``.

    Raises
    ------
    FormatError
        A job that wrote or trimmed, a block size other than 4 KiB without ``assume_bs`` (one line each).
    """
    derived = {}
    for r in recs:
        if r["writes"]:
            raise FormatError(f"{where}: {r['where']} (job {r['name']!r}, rw={r['rw']}) wrote or trimmed "
                              f"{r['writes']:.0f} blocks: the device model needs reads only (rw=randread)")
    sizes = set()
    for r in recs:
        try:
            b = int(round(r["read_bytes"])) if r["read_bytes"] else parse_block_size(r["bs"])
        except ArgumentError as exc:
            raise FormatError(f"{where}: {r['where']}: {exc}") from None
        sizes.add(b)
    shown = ", ".join(f"{b} B" for b in sorted(sizes))
    if sizes == {ENGINE_READ_BYTES} and assume_bs is not None:
        if parse_block_size(assume_bs) != ENGINE_READ_BYTES:
            raise FormatError(f"{where}: fio read blocks of {shown}, not the assumed {assume_bs}: leave "
                              "assume_bs out (fio ran at the engine's 4 KiB)")
    if sizes != {ENGINE_READ_BYTES}:
        if assume_bs is None:
            raise FormatError(f"{where}: fio read blocks of {shown}, the model's read is {ENGINE_READ_BYTES} B (one "
                              "aligned 4 KiB block a row, SPEC §8): rerun fio with --bs=4k, or state the assumption "
                              f"with fio:{where},assume_bs={sorted(sizes)[0]} (a drive of 512-byte sectors: the "
                              "engine reads its rows in 512-byte blocks, one or two a row)")
        want = parse_block_size(assume_bs)
        if want not in sizes or len(sizes) > 1:
            raise FormatError(f"{where}: fio read blocks of {shown}, not the assumed {assume_bs}")
        derived["block_size"] = {"value": float(want), "rule": f"assumed: a {want}-byte read of fio is one read of "
                                                               "the engine, as fio timed it (on a drive of 512-byte "
                                                               "sectors the engine reads a row in one or two 512-byte "
                                                               f"blocks; elsewhere one aligned {ENGINE_READ_BYTES}-byte "
                                                               "block)"}
    return derived


def _truncated(d: LatencyDist, u_cut: float) -> LatencyDist:
    """The quantile function of ``d`` below ``u_cut``, stretched to ``[0, 1]`` (the reads that did not wait)."""
    u = np.asarray(d.u)
    q = np.asarray(d.q)
    keep = u < u_cut
    uu = np.concatenate([u[keep], [u_cut]]) / u_cut
    qq = np.concatenate([q[keep], [float(np.interp(u_cut, u, q))]])
    return LatencyDist(uu, np.maximum.accumulate(qq), d.source)


def rate_limit_of(table: Dict[int, LatencyDist], recs_by_qd: Dict[int, List[dict]]):
    """``(raw table, cap_iops, burst_ios, derived)`` when fio's figures are those of a rate-limited volume
    (see the module), else ``(None, None, None, reason)``: why it is not taken as one."""
    qs = sorted(table)
    iops = {q: float(np.median([r["iops"] for r in recs_by_qd[q]])) for q in qs}  # fio's own read.iops
    peak = max(iops.values())
    flat_from = next(q for q in qs if iops[q] >= (1 - FLAT_IOPS) * peak)
    flat = [q for q in qs if q >= flat_from]
    if len(flat) < 2 or any(iops[q] < (1 - FLAT_IOPS) * peak for q in flat):
        return None, None, None, (f"not a rate-limited volume: IOPS rise to the deepest depth measured "
                                  f"({', '.join(f'{iops[q]:.0f} at {q}' for q in qs)})")
    # the median far below the mean at depth 1 or any depth of the flat run: where the cap is near the raw QD1
    # rate, few reads wait at depth 1, but at the next depths most pass fast while the mean is qd / cap
    # -- only where the flat run starts at the first depth measured: a device that saturates (an SSD) reaches its
    # peak only deep, where a slow tail (garbage collection) may put its median below half its mean too
    looked = sorted({qs[0], *flat}) if flat_from == qs[0] else [qs[0]]
    ratios = {q: (table[q].percentile(50) / table[q].mean if table[q].mean > 0 else 1.0) for q in looked}
    at = min(ratios, key=lambda q: (ratios[q], q))
    ratio = ratios[at]
    if ratio >= MEDIAN_OVER_MEAN:
        where = f"depths {', '.join(map(str, looked))}" if len(looked) > 1 else f"depth {looked[0]}"
        return None, None, None, (f"not a rate-limited volume: at {where} the median latency is at least "
                                  f"{ratio:.2f} of the mean (a throttle makes it far below, < {MEDIAN_OVER_MEAN})")
    cap = float(np.median([iops[q] for q in flat]))
    raw, cuts = {}, {}
    for q in qs:
        d = table[q]
        med = d.percentile(50)
        u = np.asarray(d.u)
        ok = u[(np.asarray(d.q) <= WAIT_FACTOR * med) & (u > 0) & (u < 1)]
        cut = float(ok.max()) if ok.size else 0.5
        cuts[q] = cut
        raw[q] = _truncated(d, cut)
    if any(raw[q].mean <= 0 for q in qs):
        return None, None, None, "not a rate-limited volume: the reads that did not wait take no time at some depth"
    raw_rate = {q: q / raw[q].mean for q in qs}
    derived = {
        "rate_limited": {"value": 1.0, "rule": (f"fio's IOPS flat within {FLAT_IOPS:.0%} from depth {flat_from} "
                                                f"to {qs[-1]} and the median at depth {at} {ratio:.2f} of the "
                                                "mean: a rate-limited volume (a token bucket over a raw device)")},
        "cap_iops": {"value": cap, "rule": f"median IOPS over depths {', '.join(map(str, flat))}"},
        "raw_device": {"value": float(max(raw_rate.values())),
                       "rule": "peak IOPS of the raw device: fio's latencies below the throttle's wait (within "
                               f"{WAIT_FACTOR:g}x of each depth's median; the slowest "
                               f"{', '.join(f'{100 * (1 - cuts[q]):.1f}% at {q}' for q in qs)} cut); assumed, "
                               "and likely too fast at deep depths: the cap hides the raw device's own queue, and "
                               "the reads kept there are the first of each grant (a 15,000-IOPS throttle of a disk "
                               "of 137,000 IOPS gave 330,000 at depth 16); it sets only how fast a burst drains"},
    }
    over = [q for q in qs if raw_rate[q] > cap * (1 + FLAT_IOPS)
            and any(r["hi"] is not None for r in recs_by_qd[q])]
    if over:
        q = over[0]
        wait = float(np.median([r["hi"] for r in recs_by_qd[q] if r["hi"] is not None]))
        burst = max(1.0, wait / (1.0 / cap - 1.0 / raw_rate[q]))
        derived["burst_ios"] = {"value": burst, "rule": (f"W / (1/cap - 1/R) at depth {q}: fio's longest wait W = "
                                                         f"{wait * 1e6:.0f} us, the raw rate R = {raw_rate[q]:.0f}/s "
                                                         "(a throttle granting burst_ios tokens every "
                                                         "burst_ios/cap seconds)")}
    else:
        burst = max(1.0, cap * THROTTLE_SLICE)
        derived["burst_ios"] = {"value": burst, "rule": f"assumed: cap x {THROTTLE_SLICE:g} s, the Linux block "
                                                        "throttle's slice (no depth where the raw device outruns "
                                                        "the cap)"}
    if max(raw_rate.values()) < cap:
        return None, None, None, "not a rate-limited volume: the reads that did not wait are no faster than the cap"
    return raw, cap, burst, derived


def _memory_backed(table: Dict[int, LatencyDist], by_qd: Dict[int, List[dict]], cpus: Optional[int]) -> tuple:
    """``(table, derived)``: the table of a memory-backed device (see the module) scaled to ``cpus`` CPUs of
    readers when given; ``derived`` empty when fio's figures are not those of a memory copy."""
    q1 = min(table)
    p50 = table[q1].percentile(50)
    if p50 >= MEMORY_QD1_P50:
        if cpus is None:
            return table, {}
        return _scaled_cpus(table, by_qd, cpus, f"cpus={cpus} stated: a memory copy, as the planner says, though "
                                                f"fio's QD{q1} median {p50 * 1e6:.1f} us is above a copy's "
                                                f"{MEMORY_QD1_P50 * 1e6:g} us (fio's engine handing each read to a "
                                                "worker thread, as io_uring does on tmpfs, or a drive); without "
                                                "a host its latencies are taken as fio measured them")
    why = (f"fio's QD{q1} median latency {p50 * 1e6:.1f} us is below {MEMORY_QD1_P50 * 1e6:g} us: a memory copy "
           "in the reading thread (tmpfs, page cache), not a drive: its IOPS are the copy rate of the CPUs fio's "
           "jobs ran on")
    if cpus is None:
        return table, {"memory_backed": {"value": 1.0, "rule": why + "; taken as they are (give cpus=N for the "
                                                                      "CPUs the engine's readers will have)"}}
    return _scaled_cpus(table, by_qd, cpus, why)


def _scaled_cpus(table: Dict[int, LatencyDist], by_qd: Dict[int, List[dict]], cpus: int, why: str) -> tuple:
    jobs = max(1, int(np.median([r.get("jobs", 1) for rs in by_qd.values() for r in rs])))
    f = cpus / jobs
    if max(table) * f > MAX_QUEUE_DEPTH:
        raise ArgumentError(f"cpus={cpus}: fio's deepest depth {max(table)} x {f:g} (the CPUs over fio's {jobs} "
                            f"job(s)) is past the deepest queue a device model takes ({MAX_QUEUE_DEPTH}, "
                            "sim.core.limits.MAX_QUEUE_DEPTH): state fewer CPUs")
    out = {1: table[min(table)]}
    if f > 1:
        out[max(1, int(round(f)))] = table[min(table)]
    for q, d in sorted(table.items()):
        if q > min(table) or f < 1:
            out[max(1, int(round(q * f)))] = d
    return out, {"memory_backed": {"value": float(cpus), "rule": f"{why}; assumed: the readers copy on {cpus} "
                                                                 f"CPU(s) where fio's {jobs} job(s) had {jobs}: a "
                                                                 f"read at depth q x {f:g} takes what one took at q "
                                                                 f"(peak IOPS x {f:g})"}}


def device_from_fio(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
                    name: str = "", *, assume_bs: Union[str, int, None] = None,
                    cpus: Optional[int] = None) -> Device:
    """A device from fio JSON output files (see the module for the rules): an
    :class:`EmpiricalDevice` bounded by its measured peak, or a :class:`RateLimitedDevice` when fio's figures are
    those of a rate-limited volume; ``derived`` says which and why, with the derived bucket.

    Parameters
    ----------
    paths : path or sequence of paths
    name : str
        Label (default: the first file's stem).
    assume_bs : str or int, optional
        fio's block size, stated as an assumption when it is not the engine's 4 KiB (e.g. ``"16k"``).
    cpus : int, optional
        CPUs the engine's readers will copy on, for a memory-backed device (see the module), 1 to 4096.

    Raises
    ------
    FormatError
        Unreadable files, no read jobs, percentiles fio could not have printed (names the depth), a job that
        wrote, a block size other than 4 KiB without ``assume_bs``, ``assume_bs`` other than what fio read.
    ArgumentError
        No paths, ``cpus`` not a whole number in [1, 4096].
    """
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, np.integer)) or
                             not 1 <= cpus <= 4096):
        raise ArgumentError(f"device_from_fio: cpus = {cpus!r} must be a whole number of CPUs in [1, 4096]")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ArgumentError("device_from_fio: no fio output file given")
    recs, derived, idle, disks = [], {}, [], False
    for p in paths:
        docs = read_fio_output(p)
        idle += idle_jobs(docs)
        disks = disks or any(isinstance(d, dict) and d.get("disk_util") for d in docs)
        got = fio_records(docs, str(p))
        derived.update(_check_reads(got, assume_bs, str(p)))
        recs += got
    if idle:
        derived["idle_jobs"] = {"value": float(len(idle)), "rule": (
            f"left out of the latency by depth: job(s) {', '.join(sorted(set(idle)))} ran with a thinktime (an "
            "idle pattern); a slowdown after idle between decode steps is not modelled")}
    by_qd: Dict[int, List[dict]] = {}
    for r in recs:
        by_qd.setdefault(r["qd"], []).append(r)
    table = {}
    for qd, rs in sorted(by_qd.items()):
        table[qd] = _dist(rs, f"{paths[0]}: queue depth {qd}")
    cpu, held = cpu_per_read(recs), cpu_held_off(recs)
    if cpu is not None:
        derived["cpu_per_read_us"] = {"value": cpu * 1e6, "rule": (
            f"fio's usr_cpu + sys_cpu x job_runtime / read.total_ios at queue depth {min(by_qd)}: the host's CPU a "
            "read takes in the kernel and fio (not the device's; the engine's own work is not in it)" +
            (f"; {held_off_text(held, min(by_qd))}" if held is not None else ""))}
    first = recs[0]
    src = (f"fio {first['rw']} {first['bs']} ({first['ioengine']}), {len(recs)} job(s) at queue depths "
           f"{', '.join(str(q) for q in table)}: mean latency = read.lat_ns.mean, percentiles of "
           f"{first['pct_from']} ({', '.join(str(p) for p in paths)})")
    label = name or Path(paths[0]).stem
    table, mem = _memory_backed(table, by_qd, cpus)
    derived.update(mem)
    if not mem and not disks:
        derived["no_block_device"] = {"value": 1.0, "rule": (
            "assumed: a drive, though fio saw no block device under the file (no disk_util in its output): tmpfs, "
            "ramfs, a network or FUSE file system; for memory (tmpfs, the page cache) give fio:FILE,cpus=N, the "
            "CPUs the engine's readers copy on: on a host its reads are then copies of the host's CPU a read")}
    raw, cap, burst, why = rate_limit_of(table, by_qd) if len(table) > 1 and not mem else \
        (None, None, None, "not checked for a rate limit: " + ("a memory copy" if mem else "one depth measured"))
    if raw is None:
        dev = EmpiricalDevice(table, label, src, peak_bound=True)
        dev.derived = {**derived, "peak_bound": {
            "value": dev.peak_iops(), "rule": f"the measured peak IOPS, never exceeded: a token bucket of it, "
                                              f"{dev.saturation_depth()} reads deep (the deepest depth measured); "
                                              f"{why}"}}
        return dev
    rawdev = EmpiricalDevice(raw, f"{label}-raw", f"{src}; the reads that did not wait for the rate limit")
    return RateLimitedDevice(rawdev, cap, burst, name=label,
                             source=f"{src}; recognised as a rate-limited volume ({cap:.0f} IOPS, {burst:.0f} reads "
                                    "deep)", derived={**derived, **why})
