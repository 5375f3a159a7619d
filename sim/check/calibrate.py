"""Calibration: the simulator's device and compute models fitted from microbenchmarks only (SPEC §9).

Input: a ``microbench.json`` document of :mod:`sim.measure` (the engine's own
reads by queue depth, fio, the compute and hash microbenchmarks).  Decode runs
are refused (:func:`calibrate` raises on a decode-run document or record), so
the cross-check (:mod:`sim.check.crosscheck`) predicts runs the calibration never saw.

The fitted model, per read backend ``b`` (``pread``, ``io_uring``), is a
:class:`~sim.device.MeasuredBatchDevice`:

batch service time by readers (what a decode step's read costs)
    the distribution of the time of a 48-row batch (24 random rows of each
    table, one decode step's worth) read with ``readers = k`` (= ring depth),
    per measured ``k``, and of a 48-row batch read serially (``k = 1``: a
    batch below the threshold is read serially whatever the backend).  It
    holds the device and everything the engine does per batch; other batch
    sizes scale by waves of reads, other reader counts interpolate.
batch service time with think time (per compute spec)
    the same, measured with a compute spec run on each batch's rows before
    the next batch (a closed loop with think time: an idle or busy gap
    changes what the next batch costs on a shared virtual disk).  A
    configuration with that compute uses these batches where measured, the
    back-to-back ones elsewhere (:meth:`Calibration.device`).
read latency by queue depth (for other clients in flight and per-read simulation)
    mean at depth ``k >= 2``: ``k / reads_per_s`` of the engine's large
    batches at ``readers = k`` (Little's law on a closed loop of ``k``
    readers); at depth 1, a serial 48-row batch's mean / 48.  Shape: fio's
    completion-latency quantile function at the nearest measured depth,
    scaled to the engine's mean; without fio, the engine's single-row serial
    read times.

compute
    per compute spec, the measured times of one step's compute (the compute
    microbenchmark and the think times of the think-time batches), resampled
    (:meth:`sim.core.params.Compute.empirical`).

Each batch and compute distribution describes a typical measurement window
(a record: one chunk of batches, one round of compute samples): its mean is
the median over windows of their means, its shape the variation within
windows.  That is the statistic the cross-check takes of repeated runs (the
median over runs of each run's figures); on a shared machine the speed of a
virtual disk moves between windows, and a disturbed window moves this little
(``windows="pooled"``: all samples as they are).
hash
    the mean time of the hash part of a step (:meth:`engram.Session.step_rows`).
windows
    per decode run, the device and compute of its own time window, from the
    probe steps interleaved with it (random token ids through the run's own
    session or sessions, :mod:`sim.check.windows`): the factors by which the
    calibrated device and compute are scaled so that the simulator
    reproduces the probes, at the run's number of sessions.  On a shared
    machine this is what carries the state of the device, the engine and the
    CPUs from one second to the next; the fit above is the shape (batch time
    by readers, latency by depth, compute distribution) they scale.

The ``fit`` diagnostics compare, per backend and depth, the measured 48-row
batch with the makespan of 48 independent reads drawn from the per-read
model (``overhead_raw_us`` = the difference): the gap shows why the batch
is modelled as measured.

The layout of ``calibration.json`` is in :mod:`sim.core.schema`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.decode.host import HostCPU
from sim.device import Device, EmpiricalDevice, LatencyDist, MeasuredBatchDevice
from sim.core.io import load_json, sha256_file, write_json
from sim.core.params import BACKENDS, Compute, Policy
from sim.core.schema import CALIBRATION_SCHEMA, STEP_ROWS, US, ComputeSpec, check_microbench, check_numbers, check_windows
from .windows import scale_device, window_compute, window_device, window_states

__all__ = ["Calibration", "calibrate", "calibrate_file", "check_study_backends", "scale_device"]


# =====================================================================================
# the calibration
# =====================================================================================
@dataclass
class Calibration:
    """Device, compute and hash models of one machine and model file.

    Attributes
    ----------
    devices : dict[str, MeasuredBatchDevice]
        Backend (``pread``, ``io_uring``) -> batch service times by readers and
        read latency by queue depth.
    compute : dict[str, Compute]
        Compute label (:class:`sim.core.schema.ComputeSpec`) -> step compute model.
    hash_s : float
        Seconds of the hash part of a step.
    fio_device : EmpiricalDevice or None
        The raw device as fio sees it (for reference; not used in predictions).
    fit : list of dict
        Diagnostics per backend and depth (see the module docstring).
    think_devices : dict[str, dict[str, MeasuredBatchDevice]]
        Compute label -> backend -> the device with the batches measured with
        that compute as think time (where measured).
    think_fit : list of dict
        Think-time batches against back-to-back ones, per compute, backend and readers.
    machine, file, source : dict
        Where the microbenchmarks ran and what they read.
    date : str
        Date of the microbenchmarks.
    windows : dict[str, dict]
        Window id (``rROUND-cINDEX``, shared with one decode run) -> the device and compute of that window,
        from the probe steps interleaved with the run (:func:`sim.check.windows.window_state`: ``"device"`` and
        ``"compute"`` factors over the calibrated ones, their relative standard errors ``"read_se"`` and
        ``"compute_se"``, the steps' own variation ``"step_cv"``, ...).
    shared_fit : list of dict
        Reads a second of several submitters at once against one reader group at the same depth.
    backends : dict
        ``{"usable": [...], "left_out": {backend: reason}}`` on the measuring machine (from the document).
    """

    devices: Dict[str, MeasuredBatchDevice]
    compute: Dict[str, Compute]
    hash_s: float
    fio_device: Optional[EmpiricalDevice] = None
    fit: List[dict] = field(default_factory=list)
    think_devices: Dict[str, Dict[str, MeasuredBatchDevice]] = field(default_factory=dict)
    think_fit: List[dict] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    file: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    date: str = ""
    windows: Dict[str, dict] = field(default_factory=dict)
    shared_fit: List[dict] = field(default_factory=list)
    backends: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ queries
    @property
    def left_out(self) -> Dict[str, str]:
        """Backends not calibrated, with the reason: those that did not start on the measuring machine."""
        out = dict(self.backends.get("left_out") or {})
        for be in BACKENDS:
            if be not in self.devices and be not in out:
                out[be] = "not measured"
        return out

    def check_backends(self, backends: Sequence[str], where: str = "the study") -> None:
        """Refuse, before any simulation, backends this calibration has no device for.

        Raises
        ------
        ArgumentError
            Names ``where`` (e.g. the study file), each missing backend, the calibration (its source
            file) and why the backend was left out on the measuring machine.
        """
        missing = [b for b in dict.fromkeys(backends) if b not in self.devices]
        if missing:
            why = self.left_out
            src = self.source.get("path") or "the calibration"
            raise ArgumentError(
                f"{where} names backend{'s' if len(missing) > 1 else ''} "
                + ", ".join(f"{b!r}" for b in missing)
                + f" on the calibrated device, which the calibration from {src} lacks (it has {sorted(self.devices)}; "
                + "; ".join(f"{b}: {why.get(b, 'not measured')}" for b in missing)
                + "): drop it from the study, or calibrate on a machine where it starts")

    def window(self, window: Optional[str]) -> Optional[dict]:
        """The state of a measurement window (see :attr:`windows`), or None."""
        return self.windows.get(window) if window else None

    def window_models(self, backend: str, compute: str, window: Optional[str] = None) -> tuple:
        """``(device, compute model)`` of ``backend`` and ``compute`` in measurement window ``window``: the
        calibrated ones scaled by the window's device factor, one session's batch and the compute in the
        shape of the window's own probe steps (:func:`sim.check.windows.window_device`,
        :func:`sim.check.windows.window_compute`), or the calibrated ones when the window was not probed."""
        dev = self.device(backend, compute)
        comp = self.compute_model(compute)
        w = self.window(window)
        if w is None:
            return dev, comp
        return window_device(dev, w, f"{dev.name}@{window}"), window_compute(comp, w)

    def device(self, backend: str, compute: str = "none") -> MeasuredBatchDevice:
        """The device model of ``backend`` for steps whose compute is ``compute``: the batches measured
        with that compute as think time where there are any, else back to back.

        Raises
        ------
        ArgumentError
            No microbenchmark of that backend.
        """
        try:
            base = self.devices[backend]
        except KeyError:
            raise ArgumentError(f"calibration has no device for backend {backend!r} "
                                f"(has {sorted(self.devices)})") from None
        label = ComputeSpec.parse(compute).label
        return self.think_devices.get(label, {}).get(backend, base)

    def policy(self, threshold: int, backend: str, readers: int) -> Policy:
        """The simulator's :class:`~sim.core.params.Policy` for an engine configuration (ring depth = readers;
        no batch overhead: the measured batch times hold it)."""
        self.device(backend)
        return Policy(threshold=int(threshold), backend=backend, readers=int(readers), ring_depth=int(readers))

    def host(self, compute: str, mode: str = "threads") -> Optional[HostCPU]:
        """The host's CPUs for steps whose compute is ``compute`` (:class:`sim.decode.host.HostCPU`, its
        ``spin_s`` that compute's) of sessions run as ``mode`` (threads of one process or processes), or None: the
        host is not modelled apart.  None here: the calibrated device and compute were measured on the host,
        under its load, and hold its CPUs' share."""
        return None

    def compute_model(self, spec: str) -> Compute:
        """The compute model of a compute spec.

        Raises
        ------
        ArgumentError
            The spec was not microbenchmarked (names it).
        """
        label = ComputeSpec.parse(spec).label
        try:
            return self.compute[label]
        except KeyError:
            raise ArgumentError(f"calibration has no compute microbenchmark for {label!r} "
                                f"(has {sorted(self.compute)}); measure it with engram measure") from None

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        comp = {}
        for label, c in self.compute.items():
            s = np.asarray(c.samples, dtype=np.float64)
            comp[label] = {"samples_us": [float(x) / US for x in s], "mean_us": float(s.mean()) / US,
                           "p50_us": float(np.median(s)) / US, "p95_us": float(np.percentile(s, 95)) / US}
        return {
            "schema": CALIBRATION_SCHEMA, "kind": "calibration", "date": self.date, "machine": self.machine,
            "file": self.file, "source": self.source,
            "devices": {b: d.to_dict() for b, d in self.devices.items()},
            "think_devices": {label: {b: d.to_dict() for b, d in devs.items()}
                              for label, devs in self.think_devices.items()},
            "fio_device": self.fio_device.to_dict() if self.fio_device is not None else None,
            "compute": comp, "hash_us": self.hash_s / US, "fit": self.fit, "think_fit": self.think_fit,
            "windows": self.windows, "shared_fit": self.shared_fit, "backends": self.backends,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "Calibration":
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        FormatError
            Not a calibration document, or a field is missing or malformed (names it; a window's fields as
            :func:`sim.core.schema.check_windows` wants them, naming the window).
        """
        if not isinstance(d, Mapping):
            raise FormatError(f"not a calibration document (a {type(d).__name__}, not a JSON object)")
        if d.get("kind") != "calibration" or d.get("schema") != CALIBRATION_SCHEMA:
            raise FormatError(f"not a calibration document (kind {d.get('kind')!r}, schema {d.get('schema')!r})")
        for key in ("devices", "compute", "think_devices"):
            if key in d and not isinstance(d[key], Mapping):
                raise FormatError(f"calibration: {key}: expected a JSON object, got {d[key]!r:.40}")
        try:
            windows = check_windows(d.get("windows"))
        except FormatError as exc:
            raise FormatError(f"calibration: {exc}") from None
        try:
            devices = {b: MeasuredBatchDevice.from_dict(v) for b, v in d["devices"].items()}
            fio = EmpiricalDevice.from_dict(d["fio_device"]) if d.get("fio_device") else None
            comp = {label: Compute.empirical([x * US for x in check_numbers(
                        f"calibration: compute {label!r}", "samples_us", v["samples_us"], 0.0)])
                    for label, v in d["compute"].items()}
            think = {label: {b: MeasuredBatchDevice.from_dict(v) for b, v in devs.items()}
                     for label, devs in d.get("think_devices", {}).items()}
            return cls(devices, comp, float(d["hash_us"]) * US, fio, list(d.get("fit", [])), think,
                       list(d.get("think_fit", [])), dict(d.get("machine", {})), dict(d.get("file", {})),
                       dict(d.get("source", {})), str(d.get("date", "")), windows,
                       list(d.get("shared_fit", [])), dict(d.get("backends", {})))
        except KeyError as exc:
            raise FormatError(f"calibration: missing field {exc}") from None
        except (AttributeError, TypeError, ValueError, ArgumentError) as exc:
            raise FormatError(f"calibration: malformed ({exc})") from None

    def save(self, path: Union[str, os.PathLike]) -> Path:
        """Write :meth:`to_dict` as JSON."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Calibration":
        """Read a calibration file.

        Raises
        ------
        FormatError
            Unreadable or not a calibration file.
        """
        d = load_json(path)
        try:
            return cls.from_dict(d)
        except FormatError as exc:
            raise FormatError(f"{path}: {exc}") from None

    def summary(self) -> str:
        lines = [f"calibration  {self.date}  machine {self.machine.get('cpu', '?')} x{self.machine.get('cores', '?')}",
                 f"file         {self.file.get('path', '?')}",
                 f"source       {self.source.get('path', '?')} ({self.source.get('records', '?')} records)",
                 f"hash         {self.hash_s / US:.2f} us a step",
                 "per backend and depth: mean read latency (engine, fio), 48-row batch mean and p50 (measured), "
                 "makespan of 48 independent reads of the per-read model",
                 f"{'backend':>9} {'qd':>4} {'engine us':>10} {'fio us':>9} {'eng/fio':>8} {'48-row us':>10} "
                 f"{'p50 us':>9} {'per-read':>9}"]
        for r in self.fit:
            fio = r.get("fio_mean_us")
            ratio = r.get("engine_over_fio")
            lines.append(f"{r['backend']:>9} {r['qd']:>4} {r['engine_mean_us']:>10.1f} "
                         f"{(f'{fio:.1f}' if fio else '-'):>9} {(f'{ratio:.2f}' if ratio else '-'):>8} "
                         f"{r['batch48_mean_us']:>10.1f} {r['batch48_p50_us']:>9.1f} "
                         f"{r['device_batch48_mean_us']:>9.1f}")
        for r in self.think_fit:
            b2b = r.get("back_to_back_mean_us")
            lines.append(f"think        {r['think']} between {r['backend']} x{r['qd']} batches: 48-row mean "
                         f"{r['batch48_mean_us']:.1f} us, p50 {r['batch48_p50_us']:.1f} us"
                         + (f" (back to back {b2b:.1f} us)" if b2b else ""))
        for r in self.shared_fit:
            one = r.get("one_group_reads_per_s")
            lines.append(f"shared       {r['backend']} {r['submitters']} submitters x {r['readers']} readers (depth "
                         f"{r['qd']}): {r['reads_per_s']:,.0f} reads/s"
                         + (f", one group of {r['qd']}: {one:,.0f} ({r['gain']:.2f}x)" if one else ""))
        for label, c in self.compute.items():
            lines.append(f"compute      {label}: mean {c.mean * 1e3:.4f} ms, cv {c.cv:.3f} ({len(c.samples)} samples)")
        if self.windows:
            f = np.array([w["device"] for w in self.windows.values()])
            lines.append(f"windows      {len(f)} probed (one per decode run, by its own interleaved probe steps): "
                         f"device factor median {np.median(f):.3f}, "
                         f"range {f.min():.3f}-{f.max():.3f}")
        for be, why in self.left_out.items():
            lines.append(f"left out     {be}: {why}")
        return "\n".join(lines)


# =====================================================================================
# fitting
# =====================================================================================
def _fio_shapes(fio: Sequence[Mapping]) -> Dict[int, tuple]:
    """qd -> (u, q / mean): fio's completion-latency quantile function at each depth, normalised to mean 1.

    Percentiles of the rounds are averaged (medians); the ends are the 1st
    percentile and a linear extrapolation past the 99.9th.
    """
    by_qd: Dict[int, List[Mapping]] = {}
    for r in fio:
        by_qd.setdefault(int(r["qd"]), []).append(r)
    out = {}
    for qd, rs in sorted(by_qd.items()):
        keys = sorted({k for r in rs for k in r if k.startswith("p") and k.endswith("_us")},
                      key=lambda k: float(k[1:-3]))
        ps = [float(k[1:-3]) for k in keys]
        vs = [float(np.median([r[k] for r in rs if k in r])) for k in keys]
        if len(ps) < 2:
            continue
        vs = list(np.maximum.accumulate(vs))
        u = [0.0] + [p / 100 for p in ps] + [1.0]
        slope = (vs[-1] - vs[-2]) / ((ps[-1] - ps[-2]) / 100)
        q = [vs[0]] + vs + [vs[-1] + slope * (1 - ps[-1] / 100)]
        u, q = np.asarray(u), np.asarray(q)
        keep = np.concatenate([[True], np.diff(u) > 0])
        u, q = u[keep], q[keep]
        mean = float(np.sum(np.diff(u) * (q[1:] + q[:-1]) / 2))
        out[qd] = (u, q / mean)
    return out


def _shape_dist(shape: tuple, mean: float, source: str) -> LatencyDist:
    u, q = shape
    return LatencyDist(u, q * mean, source)


def _dist_from_samples(x: np.ndarray, source: str, mean: Optional[float] = None) -> LatencyDist:
    """The empirical distribution of ``x`` (seconds) as a quantile function whose mean is ``mean``
    (default the sample mean).

    :meth:`LatencyDist.from_samples` interpolates between order statistics,
    which gives the extremes half weight; with a heavy tail the mean would
    come out low, so the quantiles are scaled to the wanted mean.
    """
    d = LatencyDist.from_samples(x, source=source)
    want = float(np.mean(x)) if mean is None else float(mean)
    return d if d.is_point or d.mean <= 0 else LatencyDist(d.u, d.q * (want / d.mean), source)


#: Window statistics :func:`calibrate` accepts.
WINDOWS = ("median", "pooled")


def _windowed(arrays: Sequence[np.ndarray], windows: str) -> tuple:
    """(samples, mean to fit) of samples measured in several windows (one array per record).

    ``"median"`` (with 3 or more windows): the typical window.  Its mean is the
    median over windows of the window means; its shape is the variation
    within windows (each window's samples divided by the window's mean,
    pooled), without the variation between windows.  This is the statistic
    the cross-check takes of repeated runs (the median over runs of each
    run's figures), and a window disturbed by other work on a shared machine
    moves it little.  ``"pooled"``: all samples and their mean.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays if len(a)]
    x = np.concatenate(arrays) if arrays else np.zeros(0)
    if windows == "median" and len(arrays) >= 3 and all(a.mean() > 0 for a in arrays):
        target = float(np.median([a.mean() for a in arrays]))
        return np.concatenate([a / a.mean() for a in arrays]) * target, target
    return x, float(x.mean()) if x.size else 0.0


def _sample_shape(samples_s: np.ndarray) -> tuple:
    d = LatencyDist.from_samples(samples_s, knots=129)
    return d.u, d.q / d.mean


def _nearest(shapes: Mapping[int, tuple], qd: int) -> tuple:
    return shapes[min(shapes, key=lambda k: (abs(k - qd), k))]


def _batch_stats(device: Device, n: int, k: int, seed: int) -> tuple:
    """(mean, p50) seconds of the device's makespan of ``n`` reads on ``k`` readers."""
    t, _ = device.batch_samples(n, min(k, n), size=8192, rng=np.random.default_rng(seed))
    return float(t.mean()), float(np.median(t))


class _Shapes:
    """The shape of one read's latency at a queue depth: fio's completion-latency quantile function at the
    nearest measured depth, else the engine's single-row serial reads at every depth, else none (a point)."""

    def __init__(self, fio: Sequence[Mapping], single: Sequence[Mapping]):
        self.fio = _fio_shapes(fio) if fio else {}
        self.one = None
        if self.fio:
            self.source = "fio completion-latency quantiles at the nearest measured depth, scaled to the engine's mean"
        elif single:
            self.source = "the engine's single-row serial read times (normalised), at every depth"
            self.one = _sample_shape(np.concatenate([np.asarray(r["batch_us"], dtype=np.float64)
                                                     for r in single]) * US)
        else:
            self.source = "no distribution measured: every read takes the mean"

    def dist(self, mean: float, qd: int, src: str) -> LatencyDist:
        """The distribution of mean ``mean`` (seconds) at depth ``qd``."""
        s = _nearest(self.fio, qd) if self.fio else self.one
        return LatencyDist.point(mean, src) if s is None else _shape_dist(s, mean, src)


def _fit_row(backend: str, qd: int, per_read_mean: float, fio_mean: Optional[float], x: np.ndarray, target: float,
             device_mean: float, device_p50: float) -> dict:
    """Diagnostics of one backend and depth: measured 48-row batches against the per-read model's."""
    return {"backend": backend, "qd": qd, "engine_mean_us": per_read_mean / US,
            "fio_mean_us": fio_mean / US if fio_mean else None,
            "engine_over_fio": (per_read_mean / fio_mean) if fio_mean else None,
            "batch48_mean_us": target / US, "batch48_p50_us": float(np.median(x)) / US,
            "batch48_pooled_mean_us": float(x.mean()) / US,
            "device_batch48_mean_us": device_mean / US, "device_batch48_p50_us": device_p50 / US,
            "overhead_raw_us": (target - device_mean) / US, "batches": int(x.size)}


def _backend_device(be: str, engine: Sequence[Mapping], shapes: _Shapes, qd1_mean: float, serial: LatencyDist,
                    fio_mean: Mapping[int, float], cpu: str, windows: str, seed: int) -> tuple:
    """The device of backend ``be`` (per-read table by depth, measured 48-row batches by readers) and its
    diagnostics rows.

    Raises
    ------
    ArgumentError
        No 48-row batches of the backend.
    """
    big: Dict[int, List[Mapping]] = {}
    small: Dict[int, List[Mapping]] = {}
    shared: Dict[int, List[Mapping]] = {}
    for r in engine:
        if r["backend"] != be:
            continue
        if int(r.get("submitters", 1)) > 1:
            shared.setdefault(int(r["qd"]), []).append(r)
        elif r["batch_rows"] == STEP_ROWS:
            small.setdefault(int(r["qd"]), []).append(r)
        else:
            big.setdefault(int(r["qd"]), []).append(r)
    if not small:
        raise ArgumentError(f"microbenchmarks hold no 48-row batches of backend {be!r}")
    src = (f"engine reads ({be}), {cpu}: 48-row batches of random rows timed at readers = k (k = 1: serial); "
           f"read latency at depth q = q / reads per second of decode-step batches with q reads in flight (one "
           f"group of q readers, or several submitters at once as sessions read: the faster), else of large "
           f"batches; depth 1 = serial 48-row batch / 48; shape: {shapes.source}")
    # Little's law on decode-step batches: what a step's batch meets with others in flight.
    per_depth: Dict[int, float] = {}
    for q, rs in list(small.items()) + list(shared.items()):
        reads = sum(int(r["reads"]) for r in rs)
        wall = sum(float(r["wall_s"]) if "wall_s" in r else float(np.sum(r["batch_us"])) * US for r in rs)
        if reads and wall > 0 and q >= 2:
            per_depth[q] = min(per_depth.get(q, np.inf), q * wall / reads)
    for q, rs in big.items():
        reads = sum(int(r["reads"]) for r in rs)
        wall = sum(float(r["wall_s"]) for r in rs)
        if reads and wall > 0 and q not in per_depth:
            per_depth[q] = q * wall / reads
    table = {1: shapes.dist(qd1_mean, 1, src)}
    for q, lat in sorted(per_depth.items()):
        table[q] = shapes.dist(lat, q, src)
    small = {q: [np.asarray(r["batch_us"], dtype=np.float64) * US for r in rs] for q, rs in small.items()}
    per_read = EmpiricalDevice(table, name=f"engine-{be}-per-read", source=src)
    batches = {(STEP_ROWS, 1): serial}
    fit = []
    for k, arrs in sorted(small.items()):
        x, target = _windowed(arrs, windows)
        batches[(STEP_ROWS, k)] = _dist_from_samples(x, f"{be} 48-row batches, readers {k}", target)
        m_dev, p50_dev = _batch_stats(per_read, STEP_ROWS, k, seed + k)
        fit.append(_fit_row(be, k, per_read.latency(k).mean, fio_mean.get(k), x, target, m_dev, p50_dev))
    return MeasuredBatchDevice(table, batches, name=f"engine-{be}", source=src), fit


def _shared_fit(engine: Sequence[Mapping]) -> List[dict]:
    """Reads a second of 48-row batches from several submitters at once against one reader group at the same
    depth (where both were measured), per backend and depth."""
    groups: Dict[tuple, List[Mapping]] = {}
    for r in engine:
        if r["batch_rows"] == STEP_ROWS and r["backend"] != "serial" and not r.get("think"):
            groups.setdefault((r["backend"], int(r["qd"]), int(r.get("submitters", 1))), []).append(r)

    def wall(r):
        return float(r["wall_s"]) if "wall_s" in r else float(np.sum(r["batch_us"])) * US

    rate = {key: sum(int(r["reads"]) for r in rs) / sum(wall(r) for r in rs)
            for key, rs in groups.items() if sum(wall(r) for r in rs) > 0}
    out = []
    for (be, q, m), x in sorted(rate.items()):
        if m > 1:
            one = rate.get((be, q, 1))
            out.append({"backend": be, "qd": q, "submitters": m, "readers": q // m, "reads_per_s": x,
                        "one_group_reads_per_s": one, "gain": (x / one) if one else None})
    return out


def _think_devices(think_recs: Sequence[Mapping], devices: Mapping[str, MeasuredBatchDevice],
                   backends: Sequence[str], windows: str) -> tuple:
    """Per compute, the devices whose 48-row batches were measured with that compute between batches (replacing
    the back-to-back ones where measured), and the think-time diagnostics."""
    think_devices: Dict[str, Dict[str, MeasuredBatchDevice]] = {}
    think_fit: List[dict] = []
    groups: Dict[tuple, List[Mapping]] = {}
    for r in think_recs:
        if r["batch_rows"] != STEP_ROWS:
            continue
        groups.setdefault((ComputeSpec.parse(r["think"]).label, r["backend"], int(r["qd"])), []).append(r)
    for label in sorted({g[0] for g in groups}):
        for be in backends:
            batches = dict(devices[be].batches)
            used = False
            for (lab, b, k), rs in groups.items():
                if lab != label or b not in (be, "serial"):
                    continue
                key = (STEP_ROWS, 1 if b == "serial" else k)
                x, target = _windowed([np.asarray(r["batch_us"]) * US for r in rs], windows)
                batches[key] = _dist_from_samples(x, f"{b} 48-row batches, readers {key[1]}, think time {label}",
                                                  target)
                used = True
            if used:
                base = devices[be]
                think_devices.setdefault(label, {})[be] = MeasuredBatchDevice(
                    base.measured, batches, name=f"engine-{be}-think-{label}",
                    source=base.source + f"; 48-row batches with {label} between batches where measured")
        for (lab, b, k), rs in sorted(groups.items()):
            if lab != label:
                continue
            x, target = _windowed([np.asarray(r["batch_us"]) for r in rs], windows)
            th = np.concatenate([np.asarray(r.get("think_us", []), dtype=np.float64) for r in rs])
            ref = devices[backends[0] if b == "serial" else b].batches.get((STEP_ROWS, 1 if b == "serial" else k))
            think_fit.append({"think": label, "backend": b, "qd": k, "batch48_mean_us": target,
                              "batch48_p50_us": float(np.median(x)),
                              "think_mean_us": float(th.mean()) if th.size else None,
                              "back_to_back_mean_us": ref.mean / US if ref is not None else None,
                              "batches": int(x.size)})
    return think_devices, think_fit


def _compute_models(recs: Sequence[Mapping], think_recs: Sequence[Mapping], windows: str) -> Dict[str, Compute]:
    """Per compute label, the measured step compute (the compute microbenchmark and the think times)."""
    comp_windows: Dict[str, List[np.ndarray]] = {}
    for r in recs:
        if r["kind"] == "compute":
            comp_windows.setdefault(ComputeSpec.parse(r["compute"]).label, []).append(
                np.asarray(r["samples_us"], dtype=np.float64) * US)
    for r in think_recs:  # the think times are the same compute, timed between batches
        comp_windows.setdefault(ComputeSpec.parse(r["think"]).label, []).append(
            np.asarray(r.get("think_us", ()), dtype=np.float64) * US)
    compute = {}
    for label, arrs in comp_windows.items():
        x, target = _windowed(arrs, windows)
        if x.size:
            compute[label] = Compute.empirical(x * (target / x.mean()) if x.mean() > 0 else x)
    return compute


def check_study_backends(calibration: Union["Calibration", str, os.PathLike], points: Sequence[Mapping],
                         where: str = "the study") -> None:
    """Refuse a study whose ``calibrated`` points name a backend the calibration lacks, before any simulation.

    ``points`` are the study's points (mappings with ``device`` and
    ``backend``; ``device = "calibrated:BACKEND"`` names its backend).

    Raises
    ------
    ArgumentError
        Names ``where`` (the study), the backend(s) and the calibration, with why they were left out.
    FormatError
        The calibration file cannot be read.
    """
    cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
    wanted = []
    for p in points:
        spec = str(p.get("device", ""))
        if spec == "calibrated":
            wanted.append(str(p.get("backend", "pread")))
        elif spec.startswith("calibrated:"):
            wanted.append(spec.split(":", 1)[1])
    cal.check_backends(wanted, where)


def _fio_means(fio: Sequence[Mapping]) -> Dict[int, float]:
    """Mean latency (seconds) of fio's reads by iodepth, over its records."""
    samples: Dict[int, List[float]] = {}
    for r in fio:
        samples.setdefault(int(r["qd"]), []).append(float(r["mean_us"]) * US)
    return {q: float(np.mean(v)) for q, v in samples.items()}


def _fio_device(shapes: "_Shapes", fio_mean: Mapping[int, float]) -> Optional[EmpiricalDevice]:
    """fio's 4 KiB random reads as a device (its latency shapes at its means), or None without fio."""
    if not shapes.fio:
        return None
    return EmpiricalDevice({q: _shape_dist(shapes.fio[q], fio_mean[q], "fio") for q in shapes.fio if q in fio_mean},
                           name="fio-randread-4k",
                           source="fio random 4 KiB reads, --direct=1, io_uring engine, by iodepth")


def _serial_fit_row(device: MeasuredBatchDevice, qd1_mean: float, fio_qd1: Optional[float], batch48_serial,
                    serial_mean: float, seed: int) -> dict:
    """The fit table's row of serial reads: one read at a time, its 48-row batch measured and simulated."""
    m1, p1 = _batch_stats(EmpiricalDevice(device.measured), STEP_ROWS, 1, seed)
    return _fit_row("serial", 1, qd1_mean, fio_qd1, batch48_serial, serial_mean, m1, p1)


def _hash_seconds(recs: Sequence[Mapping]) -> float:
    """Mean time to hash one token (seconds) over the hash records; 0 without any."""
    hs = [float(x) * US for r in recs if r["kind"] == "hash" for x in r["samples_us"]]
    return float(np.mean(hs)) if hs else 0.0


def _backends_doc(doc: Mapping, backends: Sequence[str]) -> dict:
    """The backends the measurement found usable (default: those it measured) and those it left out, why."""
    be_doc = dict(doc.get("backends") or {})
    return {"usable": list(be_doc.get("usable", backends)), "left_out": dict(be_doc.get("left_out") or {})}


def _provenance(doc: Mapping, source: Optional[Mapping], records: int, windows: str) -> dict:
    """The calibration's ``source``: the caller's provenance, the document's schema and date, counts."""
    src = dict(source or {})
    src.setdefault("schema", doc.get("schema"))
    src.setdefault("date", doc.get("date"))
    src["records"] = records
    src["windows"] = windows
    return src


def calibrate(doc: Mapping, *, source: Optional[Mapping] = None, seed: int = 0,
              windows: str = "median") -> Calibration:
    """Fit the device, compute and hash models from a microbenchmark document.

    Parameters
    ----------
    doc : mapping
        A ``microbench.json`` document of :func:`sim.measure.measure`
        (schema ``engram.microbench/1``), e.g. ``load_json(path)``.
    source : mapping, optional
        Provenance stored in the calibration (path, sha256).
    seed : int
        Seed of the device makespan sampling (the fit is deterministic).
    windows : {"median", "pooled"}
        ``"median"`` (default): each batch and compute distribution is that
        of a typical measurement window (records: chunks, rounds), mean the
        median of the window means, shape the variation within windows;
        ``"pooled"``: all samples pooled.

    Returns
    -------
    Calibration

    Raises
    ------
    ArgumentError
        ``doc`` is a decode-run document or holds any record that is not a
        microbenchmark (kinds ``io``, ``compute``, ``hash``): the calibration
        never reads decode runs.  Also: no serial or concurrent engine records.
    FormatError
        A probe record with a field missing, of the wrong type or out of range, or a window probed twice
        (names the record, its window, the field and the value; :func:`sim.core.schema.check_probe`).
    """
    recs = check_microbench(doc)
    probes = [r for r in recs if r.get("probe")]
    recs = [r for r in recs if not r.get("probe")]
    engine_all = [r for r in recs if r["kind"] == "io" and r.get("tool") == "engine"]
    engine = [r for r in engine_all if not r.get("think")]
    think_recs = [r for r in engine_all if r.get("think")]
    fio = [r for r in recs if r["kind"] == "io" and r.get("tool") == "fio"]
    serial48 = [r for r in engine if r["backend"] == "serial" and r["batch_rows"] == STEP_ROWS]
    single = [r for r in engine if r["backend"] == "serial" and r["batch_rows"] == 1]
    if not serial48:
        raise ArgumentError("microbenchmarks hold no serial 48-row batches")
    if windows not in WINDOWS:
        raise ArgumentError(f"windows must be one of {WINDOWS}, got {windows!r}")
    batch48_serial, serial_mean = _windowed([np.asarray(r["batch_us"]) * US for r in serial48], windows)
    qd1_mean = serial_mean / STEP_ROWS
    shapes = _Shapes(fio, single)
    backends = sorted({r["backend"] for r in engine if r["backend"] != "serial"})
    if not backends:
        raise ArgumentError("microbenchmarks hold no concurrent (pread / io_uring) reads")
    machine = dict(doc.get("machine", {}))
    fio_mean = _fio_means(fio)
    serial_dist = _dist_from_samples(batch48_serial, "serial 48-row batches", serial_mean)

    devices: Dict[str, MeasuredBatchDevice] = {}
    fit: List[dict] = []
    for be in backends:
        devices[be], rows = _backend_device(be, engine, shapes, qd1_mean, serial_dist, fio_mean,
                                            machine.get("cpu", "this machine"), windows, seed)
        fit += rows
    fit.insert(0, _serial_fit_row(devices[backends[0]], qd1_mean, fio_mean.get(1), batch48_serial, serial_mean, seed))
    think_devices, think_fit = _think_devices(think_recs, devices, backends, windows)

    fio_dev = _fio_device(shapes, fio_mean)
    hash_s = _hash_seconds(recs)
    src = _provenance(doc, source, len(recs) + len(probes), windows)
    computes = _compute_models(recs, think_recs, windows)

    def device_of(be: str, label: str) -> Optional[MeasuredBatchDevice]:
        base = devices.get(be) if be in devices else (devices[backends[0]] if be == "serial" else None)
        return None if base is None else think_devices.get(label, {}).get(be, base)

    states = window_states(probes, device_of, computes, hash_s, seed)
    backends_doc = _backends_doc(doc, backends)
    # The date is that of the measurements: the fit is a pure function of the document.
    return Calibration(devices, computes, hash_s, fio_dev, fit, think_devices, think_fit, machine,
                       dict(doc.get("file", {})), src, str(doc.get("date", "")), states, _shared_fit(engine),
                       backends_doc)


def calibrate_file(microbench: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None, *,
                   seed: int = 0, windows: str = "median") -> Calibration:
    """Calibrate from a ``microbench.json`` file (and only that file); save to ``out`` when given.

    Raises
    ------
    FormatError
        The file cannot be read as JSON, or holds a malformed probe record (names the file, the record and
        the field; see :func:`sim.core.schema.check_microbench`).
    ArgumentError
        It is not a microbenchmark document (see :func:`calibrate`).
    """
    path = Path(microbench)
    doc = load_json(path)
    try:
        cal = calibrate(doc, source={"path": str(path.resolve()), "sha256": sha256_file(path)}, seed=seed,
                        windows=windows)
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None
    if out is not None:
        cal.save(out)
    return cal
