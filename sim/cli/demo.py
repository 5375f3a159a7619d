"""The main job: ``engram demo`` (``make demo``) runs the whole mission on this machine and writes a report.

Steps (each prints a line with its wall time; long ones show a progress bar):

1. **traces** -- real text through the DeepSeek V4 tokenizer and the V4.1 hash,
   from text that ships with Python (standard-library source code and the
   English language reference of ``pydoc``), or the user's own ``--text`` files;
2. **model** -- a model file in the real GGUF format: the DeepSeek V4.1 Flash
   layout at a reduced scale (default 0.02: two tables of 7.68 M rows, 4.4 GiB
   with the projections), built once in the work folder and reused;
3. **lookups** -- a decode session over the first tokens: hash, one concurrent
   read of 48 rows, decode (checked against the generator's bytes), projection
   and gated add into a seeded random residual for both Engram layers;
4. **measure** -- the real decode loop over the traces for a grid of
   thresholds, readers, backends and computes, and 1 to 32 concurrent
   sessions (threads of one process, and processes sharing the device), with
   the microbenchmarks, in interleaved rounds (:func:`sim.measure.measure`);
   only the read backends that start on this machine (the others are named,
   with the reason, in every document and the report);
5. **calibrate** -- the simulator's device and compute models from the
   microbenchmarks only (:func:`sim.check.calibrate.calibrate_file`);
6. **crosscheck** -- every measured configuration predicted and compared,
   and the measured capacity (sessions whose slowest one reaches the target
   tokens/s) against the predicted one (:func:`sim.check.crosscheck.crosscheck_files`);
   then one single-session configuration measured again through the engine's
   row cache (:data:`DEMO_CACHE_BYTES`, its default policy) in ``rowcache/``
   and cross-checked: hit rate measured beside predicted, tokens/s predicted
   from its misses (:func:`cache_run`);
7. **devices** -- a smaller grid (one and several sessions) measured again on devices of known, other
   speeds made here: read-IOPS throttles of the disk (:data:`DEMO_THROTTLES`, a cgroup; where the kernel
   allows) and a copy of the model on tmpfs (where ``O_DIRECT`` works there), fio beside each
   (:func:`sim.measure.devices.measure_devices`); every device's runs predicted the planner's way, from its fio
   JSON and a datasheet string only, next to today's cross-check (:func:`sim.check.planner.planner_crosscheck`);
   devices the machine cannot make are named with the reason;
8. **sweep** -- the small what-if study :data:`DEMO_STUDY` (this machine next to
   the reference SSD, by readers, threshold and row cache), in local processes;
9. **report** -- :func:`sim.report.build_report` into ``reports/demo/``.

The whole run takes several minutes on a 2-core machine with an SSD (the
model file, 4.4 GiB, is written once and reused).  ``quick=True`` shrinks
every step (a 0.001-scale model, short runs) for smoke tests: about 1.5 minutes on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from engram import EngramModel, Layout, decode_rows, load_tokenizer, synth
from engram._checks import setting_int, setting_number
from engram.codec import ROW_BYTES, bf16_round
from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY as DEFAULT_CACHE_POLICY

from sim.check.calibrate import calibrate_file
from sim.check.crosscheck import capacity_shown, crosscheck_files
from sim.core.io import write_json
from sim.core.progress import progress_mode
from sim.measure import (DEFAULT_SCALE, SESSION_COUNTS, Settings, backends_here, ensure_model, measure, session_grid,
                         trace_tokens_needed, usable_configs)
from sim.measure.devices import DevicePlan, check_rates, measure_devices
from sim.check.planner import planner_crosscheck
from sim.report import ReportPage, ReportSearch, build_report, default_traces
from sim.core.schema import RunConfig
from sim.sweep import Study, run_study
from sim.sweep.study import SHIPPED_STUDIES
from sim.trace import load_trace, reuse_stats

__all__ = ["DEMO_STUDY", "DEMO_THROTTLES", "DemoMeasurement", "DemoSize", "demo_grid", "demo_study", "device_grid", "measure_settings", "run_demo"]

#: Budget of the row cache the demo measures one configuration again with (the engine's ``RowCache`` and its
#: default policy), cross-checked like the others: its tokens/s predicted from its misses (issue 26).
DEMO_CACHE_BYTES = "4M"
#: Read-IOPS throttles of the disk the demo measures again on (``quick``: the first only).
DEMO_THROTTLES = (4000, 15000)
#: Session counts of the demo's grid on the devices made here (``quick``: 1 and 2).
DEVICE_SESSIONS = (1, 2, 4, 8)

#: The demo's what-if study: the shipped ``sim/studies/demo.toml`` (``studies/demo.toml`` in the repository).
DEMO_STUDY = (SHIPPED_STUDIES / "demo.toml").read_text(encoding="utf-8")

DEFAULT_OUT = "reports/demo"
#: The title of the demo's report.
_REPORT_TITLE = "Engram on this machine: measured, predicted and what-if (engram demo)"
DEFAULT_WORKDIR = "work/demo"


class _Steps:
    """Numbered step lines with wall times."""

    def __init__(self, total: int, progress: bool):
        self.total, self.n, self.progress = total, 0, progress
        self.t0 = time.perf_counter()
        self.log: List[Dict[str, Any]] = []
        self._start = None
        self._name = ""

    def begin(self, name: str, what: str) -> None:
        self.n += 1
        self._name, self._start = name, time.perf_counter()
        if self.progress:
            print(f"[{self.n}/{self.total}] {name}: {what}", flush=True)

    def end(self, result: str = "") -> None:
        dt = time.perf_counter() - self._start
        self.log.append({"name": self._name, "seconds": round(dt, 2)})
        if self.progress:
            total = time.perf_counter() - self.t0
            print(f"      done in {dt:.1f} s (total {total / 60:.1f} min){'; ' + result if result else ''}",
                  flush=True)


#: Steps of each session in the demo's multi-session runs (full; quick runs use the demo's steps).
SESSION_STEPS = 60
#: Session counts of the quick demo's multi-session runs.
QUICK_SESSIONS = (1, 2, 4)


def demo_grid(main: str, others: Sequence[str], steps: int, quick: bool = False,
              mixer_steps: int = 30, backends: Optional[Sequence[str]] = None) -> list:
    """The measured configurations of the demo (:class:`sim.core.schema.RunConfig`).

    On the main trace: serial (thresholds 256 and 49) and concurrent
    (thresholds 48 and 8) reads with 16 pread readers; pread and io_uring at
    1, 2, 4, 8, 16 and 32 readers; an emulated 2 ms compute and the real
    Engram mixer, serial and io_uring x 16; 1, 2, 4, 8, 16 and 32 concurrent
    sessions as threads and 2 to 32 as processes (:func:`sim.measure.session_grid`,
    :data:`SESSION_STEPS` steps a session).  On every other trace: serial,
    pread x 16 and io_uring x 16.  ``quick``: 4 configurations on the main
    trace, 2 on each other one, and 1, 2, 4 sessions (threads; 2, 4 as
    processes).  Only ``backends`` (default: every backend) are kept
    (:func:`sim.measure.usable_configs`).
    """
    out: list = []

    def add(trace, thr, be, k, comp="none", n=steps):
        c = RunConfig(trace, thr, be, k, comp, n)
        if c.key not in {x.key for x in out}:
            out.append(c)

    def keep(configs):
        return configs if backends is None else usable_configs(configs, backends)[0]

    if quick:
        add(main, 256, "pread", 4)
        add(main, 8, "pread", 4)
        add(main, 8, "io_uring", 4)
        add(main, 8, "pread", 16)
        for t in others:
            add(t, 256, "pread", 4)
            add(t, 8, "io_uring", 4)
        return keep(out + [c for c in session_grid(main, steps, QUICK_SESSIONS) if c.key not in {x.key for x in out}])
    add(main, 256, "pread", 16)
    add(main, 49, "pread", 16)
    add(main, 48, "pread", 16)
    add(main, 8, "pread", 16)
    for be in ("pread", "io_uring"):
        for k in (1, 2, 4, 8, 16, 32):
            add(main, 8, be, k)
    add(main, 256, "pread", 16, "spin:2")
    add(main, 8, "io_uring", 16, "spin:2")
    add(main, 256, "pread", 16, "mixer", mixer_steps)
    add(main, 8, "io_uring", 16, "mixer", mixer_steps)
    for t in others:
        add(t, 256, "pread", 16)
        add(t, 8, "pread", 16)
        add(t, 8, "io_uring", 16)
    return keep(out + session_grid(main, SESSION_STEPS, SESSION_COUNTS))


def device_grid(main: str, steps: int, quick: bool = False, backends: Optional[Sequence[str]] = None) -> list:
    """The demo's grid on the devices made here: serial and concurrent reads (threshold 256 and 8, pread x 4)
    without compute, and :data:`DEVICE_SESSIONS` concurrent sessions as threads (``quick``: 1 and 2), pread x 4,
    5 ms of stated compute a step -- every compute one a planner can state."""
    out = [RunConfig(main, 256, "pread", 4, "none", steps), RunConfig(main, 8, "pread", 4, "none", steps)]
    out += session_grid(main, steps, (1, 2) if quick else DEVICE_SESSIONS, ("threads",))
    return out if backends is None else usable_configs(out, backends)[0]


def measure_settings(rounds: int, quick: bool, *, fio: bool = True, wait: bool = True) -> Settings:
    """The demo's measurement: short microbenchmarks; ``quick`` shorter still, never waiting for a quiet machine."""
    return Settings(rounds=rounds, depths=[1, 4, 16] if quick else [1, 2, 4, 8, 16, 32], fio=fio and not quick,
                    fio_seconds=0.3, io_batches=10 if quick else 25, io_chunks=1 if quick else 4,
                    big_seconds=0.02 if quick else 0.15, single_rows=20 if quick else 100,
                    compute_samples=10 if quick else 60, mixer_samples=3 if quick else 10, warmup=3 if quick else 8,
                    shared_seconds=0.03 if quick else 0.08, probe_every=2 if quick else 3,
                    cache_batches=20 if quick else 100,
                    max_background_cpu=None if (quick or not wait) else 0.25, wait_budget=120.0)


def cache_run(path: Path, work: Path, configs: Sequence[RunConfig], main: str, rounds: int, quick: bool,
              progress) -> Optional[dict]:
    """The first single-session configuration of ``main`` measured again (into ``work``) through a fresh
    :data:`DEMO_CACHE_BYTES` row cache of the engine's default policy, calibrated from its own
    microbenchmarks and cross-checked: ``{"config", the cross-check's row_cache figures, "tokens_per_s"
    measured / predicted, "error", "inside_interval"}``, or None when the grid has no such configuration."""
    one = next((c for c in configs if not c.multi and c.trace == main), None)
    if one is None:
        return None
    settings = replace(measure_settings(min(rounds, 2), quick, fio=False, wait=False), cache_bytes=DEMO_CACHE_BYTES,
                       cache_policy=DEFAULT_CACHE_POLICY)
    measure(path, [one], work, settings, progress=progress)
    calibrate_file(work / "microbench.json", work / "calibration.json")
    xc = crosscheck_files(work / "calibration.json", work / "runs.json", work / "crosscheck.json",
                          sim_steps=400 if quick else None, progress=progress)
    (row,) = xc["rows"]
    return {"config": row["key"], **row["row_cache"], "tokens_per_s": {"measured": row["measured"]["tokens_per_s"],
                                                                     "predicted": row["predicted"]["tokens_per_s"]},
            "error": row["error"]["tokens_per_s"], "inside_interval": bool(row["inside_interval"]),
            "workdir": str(work)}


def demo_study(quick: bool, backends: Optional[Sequence[str]] = None) -> Study:
    """:data:`DEMO_STUDY`; ``quick`` keeps 200 steps, readers 1 and 16, no row cache.  ``backends``: the
    backends the calibration has; the calibrated grid keeps only those (the others are left out, as the
    measurement left them out)."""
    study = Study.loads(DEMO_STUDY, source="sim.cli.demo.DEMO_STUDY")
    if quick:
        study.fixed.update(steps=200, trace_limit=200)
        for g in study.grids:
            g.update(readers=[1, 16], cache_rows=[0])
    if backends is not None:
        for g in study.grids:
            if "calibrated" in g.get("device", []) and "backend" in g:
                g["backend"] = [b for b in g["backend"] if b in backends]
    return study


def _traces(specs: Sequence[str], lay, steps: int, rounds: int, quick: bool,
            backends: Optional[Sequence[str]] = None) -> tuple:
    """The demo's traces under ``lay``: (trace by spec, the longest one's spec, the measured configurations,
    one summary per trace).

    Raises
    ------
    ArgumentError
        A text too short for its measured runs.
    """
    full = {spec: load_trace(spec, layout=lay) for spec in specs}
    main = max(specs, key=lambda s: full[s].steps)
    configs = demo_grid(main, [s for s in specs if s != main], steps, quick, backends=backends)
    need = trace_tokens_needed(configs, rounds)
    for spec, n in need.items():
        if full[spec].steps < n:
            raise ArgumentError(f"text {spec!r} has {full[spec].steps} tokens; the demo's runs on it need {n} "
                                f"({rounds} rounds, each run its own stretch): give a longer text, or fewer "
                                f"--steps/--rounds")
    info = []
    for spec in specs:
        rs = reuse_stats(full[spec].head(2000))
        info.append({"label": spec.split("/")[-1], "source": spec, "tokens": min(full[spec].steps, need.get(spec, 0)),
                     "tokens_in_text": full[spec].steps, "reuse_rate": rs.reuse_rate})
    return full, main, configs, info


def _lookups(model_path: Path, trace, n: int, seed: int = 0) -> dict:
    """A decode session over the first ``n`` tokens of ``trace``: rows (verified), read times, gates."""
    model = EngramModel.open(model_path)
    tok = load_tokenizer()
    rng = np.random.default_rng(seed)
    for lid in model.layer_ids:
        model.weights(lid)
    records, ok, read_ms, mix_ms = [], True, [], []
    tokens = trace.tokens[:n].tolist()
    with model.session() as s:
        for pos, t in enumerate(tokens):
            t0 = time.perf_counter()
            rows = s.step(int(t))
            read_ms.append((time.perf_counter() - t0) * 1e3)
            ids = s.last_row_ids
            gates = []
            t1 = time.perf_counter()
            for li, lid in enumerate(model.layer_ids):
                want = decode_rows(synth.rows_at(lid, ids[li].astype(np.uint64), seed=0))
                ok = ok and bool(np.array_equal(want, rows[lid]))
                width = model.weights(lid).q_norm.shape[1]
                residual = bf16_round(rng.standard_normal((1, 4, width)).astype(np.float32))
                g = np.zeros((1, 4), np.float32)
                s.apply(lid, residual, rows[lid][None], gates_out=g)
                gates.append([float(x) for x in g[0]])
            mix_ms.append((time.perf_counter() - t1) * 1e3)
            records.append({"position": pos, "token": int(t), "text": tok.decode([int(t)]),
                            "rows": [int(x) for x in ids[0][:6]], "read_ms": read_ms[-1],
                            "backend": s.last_stats.backend, "gates": gates})
    return {"source": trace.source, "tokens": len(tokens), "rows_verified": ok, "records": records,
            "read_ms_mean": float(np.mean(read_ms)), "mix_ms_mean": float(np.mean(mix_ms))}


@dataclass(frozen=True)
class DemoSize:
    """How big the demo's model file and runs are; None (for ``steps`` and ``rounds`` 0 too): the default, smaller
    with ``quick`` (:meth:`resolved`).

    Attributes
    ----------
    scale : float, optional
        Layout scale of the model file (in (0, 1]; default 0.02: 4.4 GiB; ``quick``: 0.001).
    steps, rounds : int, optional
        Decode steps per measured run (at least 10; default 200; quick 40) and interleaved rounds (at least 1;
        default 5; quick 2).
    lookups : int, optional
        Tokens of the lookup step (at least 1; default 16; quick 4).

    Raises
    ------
    ArgumentError
        Names the field and the value: ``scale`` not None or a finite number in (0, 1] (a bool or a string
        included), ``steps``, ``rounds`` or ``lookups`` not None or a whole number (a bool, a float or a string)
        in its range.
    """

    scale: Optional[float] = None
    steps: Optional[int] = None
    rounds: Optional[int] = None
    lookups: Optional[int] = None

    def __post_init__(self) -> None:
        if self.scale is not None:
            object.__setattr__(self, "scale", setting_number("DemoSize.scale", self.scale, 0.0, 1.0, above=True))
        for name, least in (("steps", 10), ("rounds", 1)):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                      and v == 0):
                try:
                    v = setting_int(f"DemoSize.{name}", v, least)
                except ArgumentError as exc:
                    raise ArgumentError(f"{exc} (or 0: the default)") from None
                object.__setattr__(self, name, v)
        if self.lookups is not None:
            object.__setattr__(self, "lookups", setting_int("DemoSize.lookups", self.lookups, 1))

    def resolved(self, quick: bool) -> "DemoSize":
        """Every field given: the defaults (``quick``'s) filled in."""
        return DemoSize(float(self.scale) if self.scale is not None else (0.001 if quick else DEFAULT_SCALE),
                        int(self.steps) if self.steps else (40 if quick else 200),
                        int(self.rounds) if self.rounds else (2 if quick else 5),
                        int(self.lookups) if self.lookups is not None else (4 if quick else 16))


@dataclass(frozen=True)
class DemoMeasurement:
    """How the demo measures.

    Attributes
    ----------
    fio : bool
        Run fio's microbenchmarks when fio is installed (and beside each device of the devices step).
    wait : bool
        Let each measurement wait for a quiet machine (other processes below a
        quarter of the CPUs and 1000 disk requests a second; at most 2 minutes
        in all) and redo one that others disturbed (default False: every run
        is predicted with the device of its own time window instead, and the
        cross-check says which regime it ran in); ``quick`` never waits.
    throttles : sequence of int, optional
        Read-IOPS throttles of the disk the devices step measures on (default :data:`DEMO_THROTTLES`; quick:
        its first; ``()``: none).
    tmpfs : bool
        Also measure on a copy of the model on tmpfs (where ``O_DIRECT`` works there).

    Raises
    ------
    ArgumentError
        A flag that is not true or false (names the field and the value), a throttle that is not a whole number
        of read IOPS or given twice (:func:`sim.measure.devices.check_rates`).
    """

    fio: bool = True
    wait: bool = False
    throttles: Optional[Sequence[int]] = None
    tmpfs: bool = True

    def __post_init__(self) -> None:
        for name in ("fio", "wait", "tmpfs"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"demo {name} = {getattr(self, name)!r} must be true or false")
        if self.throttles is not None:
            check_rates(self.throttles)


def run_demo(out: Union[str, os.PathLike] = DEFAULT_OUT, *, workdir: Union[str, os.PathLike] = DEFAULT_WORKDIR,
             texts: Optional[Sequence[str]] = None, quick: bool = False, size: DemoSize = DemoSize(),
             measurement: DemoMeasurement = DemoMeasurement(), jobs: Optional[int] = None, html_page: bool = True,
             progress: Union[bool, str] = True) -> Path:
    """Run the main job and return the path of the report (``OUT/report.md``).

    Parameters
    ----------
    out : path
        Report folder (default ``reports/demo``).
    workdir : path
        Work folder: the model file (reused when it has the layout of
        ``size.scale``), traces, measurements, calibration, cross-check, sweep table.
    texts : sequence of str, optional
        The user's own text files (or any trace source spec) instead of the
        built-in standard-library texts.
    quick : bool
        Small and fast (smoke tests): a tiny model, a few short runs.
    size : DemoSize
        The model file's scale, the runs' steps and rounds, the lookup step's tokens.
    measurement : DemoMeasurement
        fio, waiting for a quiet machine, the devices step's throttles and tmpfs.
    jobs : int, optional
        Local processes of the sweep and the report's simulations (default: CPU count).
    html_page : bool
        Also write ``report.html``.
    progress : bool or str
        :mod:`sim.core.progress` mode: ``"auto"`` (``True``) step lines and progress bars on a terminal, plain
        progress lines elsewhere; ``"lines"`` step lines and plain progress lines, never a bar; ``"off"``
        (``False``) nothing.

    Raises
    ------
    ArgumentError
        A text too short for the measured runs, too little disk space, a bad argument.
    """
    demo = _Demo(Path(out), Path(workdir), quick, size.resolved(quick), measurement, jobs, progress_mode(progress))
    demo.work.mkdir(parents=True, exist_ok=True)
    if demo.progress != "off":
        print(f"engram demo: work folder {demo.work}, report folder {demo.out}", flush=True)
    demo.traces(texts)
    demo.model()
    demo.lookups()
    demo.measure()
    demo.calibrate()
    demo.crosscheck()
    demo.devices()
    demo.sweep()
    md = demo.report(html_page)
    if demo.progress != "off":
        total = time.perf_counter() - demo.t_start
        print(f"engram demo: finished in {total / 60:.1f} min", flush=True)
    return md


class _Demo:
    """The demo's steps, one method each, and what each leaves for the next (the steps' lines in ``st``)."""

    def __init__(self, out: Path, work: Path, quick: bool, size: DemoSize, measurement: DemoMeasurement,
                 jobs: Optional[int], progress: str):
        self.out, self.work, self.quick, self.size, self.m = out, work, quick, size, measurement
        self.jobs, self.progress = jobs, progress
        self.st = _Steps(9, progress != "off")
        self.t_start = time.perf_counter()
        self.planned: Optional[dict] = None

    def traces(self, texts: Optional[Sequence[str]]) -> None:
        """1. Real text through the tokenizer and the hash."""
        st, size = self.st, self.size
        self.lay = Layout.deepseek_v41_flash(scale=size.scale)
        self.specs = list(texts) if texts else default_traces()
        self.usable, self.left_out = backends_here()
        st.begin("traces", "real text -> DeepSeek V4 tokenizer -> V4.1 hash: " + ", ".join(self.specs))
        self.full, self.main, self.configs, self.trace_info = _traces(self.specs, self.lay, size.steps, size.rounds,
                                                                      self.quick, self.usable)
        st.end("; ".join(f"{t['label']}: {t['tokens_in_text']:,} tokens, {t['reuse_rate'] * 100:.1f}% of row reads "
                         f"repeat (first 2000)" for t in self.trace_info))

    def model(self) -> None:
        """2. The model file, built once and reused."""
        st, lay, scale, progress = self.st, self.lay, self.size.scale, self.progress
        self.table_bytes = int(sum(int(r) for r in lay.rows)) * ROW_BYTES
        path = self.path = self.work / f"model-s{scale:g}.gguf"
        reuse = path.exists()
        st.begin("model", f"{'reuse' if reuse else 'build'} {path} (V4.1 Flash layout at scale {scale:g}: "
                          f"{', '.join(f'{int(r):,}' for r in lay.rows)} rows, {self.table_bytes / 2**30:.2f} GiB of "
                          f"tables + 0.59 GiB of projections)")
        t0 = time.perf_counter()
        ensure_model(path, scale, progress=progress == "auto")  # a tqdm bar, or nothing
        self.build_s = None if reuse else time.perf_counter() - t0
        self.bytes = path.stat().st_size
        st.end(f"{self.bytes / 2**30:.2f} GiB")

    def lookups(self) -> None:
        """3. Lookups and gated adds of a decode session.

        Raises
        ------
        ArgumentError
            The rows read differ from the generator's.
        """
        st, n_lookups, path = self.st, self.size.lookups, self.path
        st.begin("lookups", f"decode session over the first {n_lookups} tokens of {self.main}: rows read, verified, "
                            f"projected and gate-added (both Engram layers)")
        lk = self.lk = _lookups(path, self.full[self.main], n_lookups)
        st.end(f"rows {'verified' if lk['rows_verified'] else 'MISMATCH'}, read {lk['read_ms_mean']:.3f} ms, "
               f"projection + gated add {lk['mix_ms_mean']:.1f} ms a token")
        if not lk["rows_verified"]:
            raise ArgumentError(f"{path}: rows read differ from the generator's (a model file from another seed?); "
                                "delete it and run again")

    def measure(self) -> None:
        """4. The measured decode runs and the microbenchmarks."""
        st, configs, rounds, m = self.st, self.configs, self.size.rounds, self.m
        multi = [c for c in configs if c.multi]
        fewest, most = (min(c.sessions for c in multi), max(c.sessions for c in multi)) if multi else (1, 1)
        st.begin("measure", f"{len(configs)} configurations ({len(multi)} of {fewest} to {most} concurrent sessions) x "
                            f"{rounds} rounds, and "
                            f"the microbenchmarks, interleaved; backends {', '.join(self.usable)}"
                            + "".join(f"; {b} left out: {why}" for b, why in self.left_out.items()))
        res = measure(self.path, configs, self.work, measure_settings(rounds, self.quick, fio=m.fio, wait=m.wait),
                      progress=self.progress)
        st.end(f"{res['runs_done']} runs; {res.get('waited_s', 0.0):.0f} s waiting for a quiet machine"
               + "".join(f"; warning: {w}" for w in res.get("warnings", [])))

    def calibrate(self) -> None:
        """5. The simulator's models from the microbenchmarks only."""
        work = self.work
        self.st.begin("calibrate", "device and compute models from the microbenchmarks only")
        cal = self.cal = calibrate_file(work / "microbench.json", work / "calibration.json")
        self.st.end(f"backends {', '.join(sorted(cal.devices))}; computes {', '.join(sorted(cal.compute))}")

    def crosscheck(self) -> None:
        """6. Every measured configuration predicted, then one again through the row cache."""
        st, work, quick, progress = self.st, self.work, self.quick, self.progress
        st.begin("crosscheck", "every measured configuration predicted by the calibrated simulator")
        xc = self.xc = crosscheck_files(work / "calibration.json", work / "runs.json", work / "crosscheck.json",
                                        sim_steps=400 if quick else None, progress=progress)
        s = xc["summary"]
        caps = "; ".join(f"capacity ({c['mode']}) at {c['target_tokens_per_s']:g} tokens/s: measured "
                         f"{capacity_shown(c, 'measured')}, predicted {capacity_shown(c, 'predicted')}"
                         for c in xc.get("capacity", []))
        rc = self.rc = cache_run(self.path, work / "rowcache", self.configs, self.main, self.size.rounds, quick,
                                 progress)
        cached = (f"; again with a {DEMO_CACHE_BYTES} {rc['policy']} row cache ({rc['config']}): hit rate measured "
                  f"{rc['hit_rate_measured']:.3f}, predicted {rc['hit_rate_predicted']:.3f}, tokens/s error "
                  f"{rc['error'] * 100:+.1f}%, {'inside' if rc['inside_interval'] else 'OUTSIDE'} its 90% interval"
                  if rc else "")
        st.end(f"tokens/s median |error| {s['tokens_per_s']['median_abs_error'] * 100:.1f}%, max "
               f"{s['tokens_per_s']['max_abs_error'] * 100:.1f}%; median spread of repeats "
               f"{s['spread']['tokens_per_s_median'] * 100:.1f}%; {s['inside_interval_share'] * 100:.0f}% of the "
               f"configurations inside their 90% interval; regime {s['regime']['name']}"
               + (f"; {caps}" if caps else "") + cached)

    def devices(self) -> None:
        """7. A smaller grid again on the devices made here, predicted the planner's way."""
        st, quick, m = self.st, self.quick, self.m
        thr = list(DEMO_THROTTLES[:1] if quick else DEMO_THROTTLES) if m.throttles is None else list(m.throttles)
        dev_grid = device_grid(self.main, 20 if quick else SESSION_STEPS, quick, self.usable)
        st.begin("devices", f"{len(dev_grid)} configurations again on "
                            + ", ".join([f"a {n}-IOPS throttle of the disk" for n in thr]
                                        + (["tmpfs"] if m.tmpfs else []))
                            + "; fio beside each; every run predicted from fio JSON and a datasheet string only")
        self.dev_work = self.work / "devices-grid"
        if (thr or m.tmpfs) and not (m.fio and shutil.which("fio")):
            st.end("skipped: planner mode predicts from the fio beside each device's runs, and fio is "
                   + ("turned off (--no-fio)" if not m.fio else "not installed (apt-get install fio)"))
        elif thr or m.tmpfs:
            self._measure_devices(dev_grid, thr)
        else:
            st.end("none asked")

    def _measure_devices(self, dev_grid: Sequence[RunConfig], thr: Sequence[int]) -> None:
        """The devices step's measurement and planner cross-check."""
        quick, dev_work = self.quick, self.dev_work
        lines: List[str] = []
        dev_settings = measure_settings(1 if quick else min(self.size.rounds, 2), quick, fio=False, wait=False)
        if quick:  # the runs only: planner mode needs no microbenchmark (today's cross-check does)
            dev_settings = replace(dev_settings, micro=False, warmup=2)
        measure_devices(self.path, dev_grid, dev_work, dev_settings,
                        devices=DevicePlan(throttles=thr, tmpfs=self.m.tmpfs, fio=self.m.fio,
                                           fio_seconds=0.1 if quick else 0.5,
                                           fio_depths=(1, 16) if quick else (1, 2, 4, 8, 16, 32, 64)),
                        progress=self.progress, say=lines.append)
        planned = self.planned = planner_crosscheck(dev_work, sim_steps=200 if quick else None, today=not quick)
        write_json(self.work / "planner.json", planned)
        told = "; ".join(f"{e['name']} " + ("built" if e["built"] else f"skipped ({e['reason']})")
                         for e in planned["devices"])
        errs = "; ".join(f"{e['name']} {mode} {m['summary']['tokens_per_s']['median_abs_error'] * 100:.0f}%"
                         for e in planned["devices"] for mode, m in e["modes"].items()
                         if m.get("summary", {}).get("tokens_per_s"))
        self.st.end(f"{told}; planner mode tokens/s median |error|: {errs or 'none'}")

    def sweep(self) -> None:
        """8. The small what-if study."""
        st = self.st
        study = demo_study(self.quick, sorted(self.cal.devices))
        self.sweep_path = self.work / "sweep-demo.csv"
        st.begin("sweep", f"study '{study.name}': {len(study.points())} simulated points in local processes")
        sw = run_study(study, jobs=self.jobs, calibration=self.work / "calibration.json", progress=self.progress,
                       out=self.sweep_path)
        st.end(f"{sw.runner}, table {self.sweep_path}")

    def _document(self) -> dict:
        """``demo.json``: the model file, traces, lookups, steps, backends, capacity, row cache, devices."""
        planned, size = self.planned, self.size
        return {"kind": "demo", "model": {"path": str(self.path), "bytes": self.bytes, "scale": size.scale,
                                          "rows": [int(r) for r in self.lay.rows], "table_bytes": self.table_bytes,
                                          "build_s": self.build_s},
                "traces": self.trace_info, "lookups": self.lk, "steps": self.st.log,
                "backends": {"usable": list(self.usable), "left_out": dict(self.left_out),
                             "study_backends": sorted(self.cal.devices)},
                "capacity": self.xc.get("capacity", []), "regime": self.xc["summary"]["regime"], "row_cache": self.rc,
                "devices": {"workdir": str(self.dev_work), "built": (planned or {}).get("built", []),
                            "skipped": (planned or {}).get("skipped", {})},
                "settings": {"steps": size.steps, "rounds": size.rounds, "quick": self.quick, "texts": self.specs}}

    def report(self, html_page: bool) -> Path:
        """9. The report, with ``demo.json`` beside the measurements."""
        st, work, out = self.st, self.work, self.out
        st.begin("report", f"figures and tables into {out}")
        demo_doc = self._document()
        write_json(work / "demo.json", demo_doc)
        md = build_report(out, workdir=work, sweeps=[self.sweep_path], search=ReportSearch(jobs=self.jobs),
                          page=ReportPage(html_page=html_page, title=_REPORT_TITLE),
                          quick=self.quick, progress=self.progress)
        st.end()
        demo_doc["steps"] = st.log
        write_json(work / "demo.json", demo_doc)
        return md
