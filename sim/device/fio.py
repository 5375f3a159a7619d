"""A device from fio's own output: ``fio --output-format=json``, one run or several, at several iodepths.

Each read job of the output is a closed loop of ``iodepth`` outstanding
reads -- what :class:`~sim.device.models.EmpiricalDevice` tabulates by queue
depth.  Per job: the queue depth is ``iodepth`` (job option, else global
option, else 1) times ``numjobs`` when ``group_reporting`` merged the clones
(clones reported one by one, under one job name of one run, ran together:
their depths and IOPS add up); the mean latency is ``read.lat_ns.mean``
(submission + completion; ``depth / iops`` by Little's law when absent); the
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
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from ..io import read_text
from ..schema import LATENCY, check_number
from .latency import LatencyDist
from .models import EmpiricalDevice

__all__ = ["device_from_fio", "fio_records", "is_fio_output", "read_fio_output"]

_NS = 1e-9


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
    if not (np.isfinite(v) and v >= 0):
        raise FormatError(f"{path}: expected a finite number >= 0, got {float(v):g}")
    return float(v)


def _latency(v, where: str, key: str) -> float:
    """``v`` (ns) as a float: a latency of fio's, a finite number > 0 (:data:`sim.schema.LATENCY`; names
    the JSON path ``where.key`` and the value)."""
    return check_number(where, key, v, LATENCY)


def _shown(v) -> str:
    text = json.dumps(v) if not isinstance(v, float) else f"{v:g}"
    return text if len(text) <= 40 else text[:37] + "..."


def _opt(job: dict, glob: dict, key: str, default: str, where: str) -> str:
    return str(_obj(job, "job options", f"{where}[\"job options\"]").get(key, glob.get(key, default)))


def _job_figures(job, glob: dict, where: str) -> dict:
    """One read job's depth, IOPS, mean latency and percentiles (seconds); ``where`` is its JSON path.

    Raises
    ------
    FormatError
        A field of the wrong type, a negative or non-finite figure, a percentile that is not a number
        (names the JSON path and the value).
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
    if "group_reporting" in _obj(job, "job options", f"{where}[\"job options\"]") or "group_reporting" in glob:
        depth *= clones
    lat, clat = _obj(r, "lat_ns", f"{where}.read.lat_ns"), _obj(r, "clat_ns", f"{where}.read.clat_ns")
    rd = f"{where}.read"
    mean = _latency(lat["mean"], rd, "lat_ns.mean") * _NS if "mean" in lat else depth / iops
    src = "read.lat_ns"
    if lat.get("percentile"):
        pct, shift, ends, at = _obj(lat, "percentile", f"{where}.read.lat_ns.percentile"), 0.0, lat, "lat_ns"
    else:
        src = "read.clat_ns + mean submission latency"
        pct = _obj(clat, "percentile", f"{where}.read.clat_ns.percentile")
        cmean = _latency(clat["mean"], rd, "clat_ns.mean") * _NS if "mean" in clat else mean
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
    return {"qd": depth, "iops": iops, "mean": mean, "pct": pcts, "lo": lo, "hi": hi,
            "rw": _opt(job, glob, "rw", "?", where), "bs": _opt(job, glob, "bs", "4k", where),
            "ioengine": _opt(job, glob, "ioengine", "?", where), "name": str(job.get("jobname", "?")),
            "pct_from": src}


def fio_records(docs: Sequence[dict], where: str = "fio output") -> List[dict]:
    """Per read job (clones of one run merged): ``{"qd", "iops", "mean", "pct", "rw", "bs", "ioengine"}``.

    Raises
    ------
    FormatError
        A document without jobs, no read job at all, or a field of the wrong type or range (names its JSON
        path, e.g. ``jobs[0].read.clat_ns.percentile["99.000000"]``, and the value).
    """
    out = []
    for di, doc in enumerate(docs):
        jobs = doc.get("jobs")
        if not isinstance(jobs, list):
            raise FormatError(f"{where}: run {di} has no 'jobs' list")
        run = f"{where}: " + (f"run {di}: " if len(docs) > 1 else "")
        glob = _obj(doc, "global options", f'{run}"global options"')
        by_name: Dict[str, List[dict]] = {}
        for ji, job in enumerate(jobs):
            f = _job_figures(job, glob, f"{run}jobs[{ji}]")
            if f:
                by_name.setdefault(f["name"], []).append(f)
        for group in by_name.values():
            if len(group) == 1:
                out.append(group[0])
                continue
            keys = set.intersection(*(set(g["pct"]) for g in group))
            out.append(dict(group[0], qd=sum(g["qd"] for g in group), iops=sum(g["iops"] for g in group),
                            mean=float(np.mean([g["mean"] for g in group])),
                            pct={p: float(np.median([g["pct"][p] for g in group])) for p in keys}))
    if not out:
        raise FormatError(f"{where}: no read job with completed reads")
    return out


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


def device_from_fio(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
                    name: str = "") -> EmpiricalDevice:
    """An :class:`EmpiricalDevice` from fio JSON output files (see the module for the rules).

    Raises
    ------
    FormatError
        Unreadable files, no read jobs, or percentiles fio could not have printed (names the depth).
    ArgumentError
        No paths.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ArgumentError("device_from_fio: no fio output file given")
    recs = []
    for p in paths:
        recs += fio_records(read_fio_output(p), str(p))
    by_qd: Dict[int, List[dict]] = {}
    for r in recs:
        by_qd.setdefault(r["qd"], []).append(r)
    table = {}
    for qd, rs in sorted(by_qd.items()):
        table[qd] = _dist(rs, f"{paths[0]}: queue depth {qd}")
    first = recs[0]
    src = (f"fio {first['rw']} {first['bs']} ({first['ioengine']}), {len(recs)} job(s) at queue depths "
           f"{', '.join(str(q) for q in table)}: mean latency = read.lat_ns.mean, percentiles of "
           f"{first['pct_from']} ({', '.join(str(p) for p in paths)})")
    return EmpiricalDevice(table, name or Path(paths[0]).stem, src)
