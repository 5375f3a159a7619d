"""sim.check.planner: the planner-mode cross-check's document on a real small measurement, its datasheet strings and
its refusals."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from engram import ArgumentError, FormatError, synth
from sim.measure import Settings
from sim.measure.devices import DevicePlan, engine_read_size, fio_json, measure_devices
from sim.check.planner import _Planner, _fio_files, _worst
from sim.check.planner import _plain as _plain_line
from sim.check.planner import (HOST_BOUND_SHARE, PLANNER_SCHEMA, PLANNER_TARGETS, THROTTLE_SLICE_S, after_notes,
                               datasheet_notes,
                               after_text, between, check_devices, check_fio, datasheet_spec,
                               fio_figures, host_cpu, host_notes, is_memory, markdown_table, planner_compute,
                               planner_crosscheck)
from sim.report.devices import devices_section
from sim.report.document import Doc
from sim.report.inputs import Inputs
from sim.core.schema import RunConfig
from sim.check.planner import PlannerModels
from sim.decode.host import HostCPU, engine_profile
from sim.device import ParametricSSD
from sim.device.fio import idle_jobs, read_fio_output
from sim.trace import CODE_SOURCE
from tests.clirun import cli
from tests.modelfiles import SCALE, token_map as _token_map


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Runs on every device this machine builds (the disk; a 6000-IOPS throttle and tmpfs where they work), fio
    beside them at depths 1 and 4: one configuration a planner can state, one it cannot (blas), two sessions."""
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed: planner mode reads the fio beside the runs")
    d = tmp_path_factory.mktemp("planner")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=6),
                      synth.Fill(projections=False), progress=False)
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 20), RunConfig(CODE_SOURCE, 8, "pread", 4, "blas:1", 20),
            RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 15, 2, "threads")]
    s = Settings(rounds=2, micro=False, warmup=2, probe_every=2, capacity_target=50.0)
    measure_devices(path, cfgs, d / "w", s,
                    devices=DevicePlan(throttles=[6000], tmpfs=True, fio_seconds=0.1, fio_depths=(1, 4)),
                    progress=False)
    return d / "w"


@pytest.mark.heavy
def test_planner_document(measured):
    res = planner_crosscheck(measured, sim_steps=300)
    saved = json.loads((measured / "planner.json").read_text())
    assert saved["schema"] == PLANNER_SCHEMA == res["schema"] and saved["kind"] == "planner_crosscheck"
    devices = json.loads((measured / "devices.json").read_text())["devices"]
    assert [e["name"] for e in res["devices"]] == [d["name"] for d in devices]
    assert res["built"] == [d["name"] for d in devices if d["built"]]
    assert set(res["skipped"]) == {d["name"] for d in devices if not d["built"]}
    assert "disk" in res["built"]
    text = markdown_table(res)
    assert "Devices built: " + ", ".join(res["built"]) in text
    for e, d in zip(res["devices"], devices):
        if not e["built"]:
            assert e["reason"] == d["reason"] and e["reason"] in text
            continue
        # the configuration whose compute only a microbenchmark knows is left out, with the reason
        assert len(e["left_out"]) == 1 and "blas:1" in next(iter(e["left_out"]))
        assert "microbenchmark" in next(iter(e["left_out"].values()))
        size = d["read_size"]
        figs = fio_figures(check_fio(measured / d["fio"][str(size)], size))
        # the datasheet string, from the fio JSON as fio wrote it
        raw = [json.loads(x) for x in (measured / d["fio"][str(size)]).read_text().splitlines() if x.strip()]
        qd1 = next(r for r in raw if r["jobs"][0]["job options"]["iodepth"] == "1")["jobs"][0]["read"]
        peak = max(r["jobs"][0]["read"]["iops"] for r in raw)
        assert figs["qd1_mean_us"] == pytest.approx(qd1["lat_ns"]["mean"] / 1e3)
        assert figs["peak_iops"] == pytest.approx(peak)
        # every string states the routed drive (sim.check.planner.ROUTING_RULE)
        assert e["datasheet"].startswith("ssd:qd1_us=") and e["datasheet"].endswith(",routing=random")
        if d["class"] == "throttled":  # the drive behind the volume: the raw disk's QD1 mean (its fio beside)
            disk = next(x for x in devices if x["name"] == "disk")
            dfigs = fio_figures(check_fio(measured / disk["fio"][str(disk["read_size"])], disk["read_size"]))
            assert e["datasheet"].startswith(f"ssd:qd1_us={dfigs['qd1_mean_us']:.1f},")
            assert f"cap_iops={peak:.0f},burst_ios={max(1, round(peak * THROTTLE_SLICE_S))}" in e["datasheet"]
        elif d["class"] == "disk":
            assert e["datasheet"] == f"ssd:qd1_us={qd1['lat_ns']['mean'] / 1e3:.1f},iops={peak:.0f},routing=random"
        else:  # memory-backed: fio's IOPS scaled to the readers' CPUs where fio's figures say a memory copy
            assert e["datasheet"].startswith(f"ssd:qd1_us={qd1['lat_ns']['mean'] / 1e3:.1f},iops=")
        # a simulator without rate-limited volumes reads the string without the cap, and says so
        fallback = f"ssd:qd1_us={max(round(qd1['lat_ns']['mean'] / 1e3, 1), np.ceil(1e7 / peak) / 10):.1f},iops={peak:.0f}"
        if e["modes"]["datasheet"]["refused"]:  # e.g. a QD1 latency below 1 / IOPS: said, nothing predicted
            assert e["datasheet_used"] == "" and e["modes"]["datasheet"]["rows"] == []
        else:
            assert e["datasheet_used"] == (fallback if e["datasheet_fallback"] else e["datasheet"])
        assert not e["datasheet_fallback"] or d["class"] == "throttled"
        assert set(e["modes"]) == {"fio", "datasheet"}
        for mode, m in e["modes"].items():
            if m["refused"]:
                assert m["refused"] in text
                continue
            rows = m["rows"]
            assert [r["sessions"] for r in rows] == [1, 2]
            err = np.abs([r["error"] for r in rows])
            t = m["summary"]["tokens_per_s"]
            assert t["median_abs_error"] == pytest.approx(np.median(err)) and t["max_abs_error"] == pytest.approx(err.max())
            for r in rows:
                assert r["measured"] > 0 and r["predicted"] > 0
                if e.get("memory_backed"):  # copies on the host are fixed: with two runs (no model spread) and a
                    # compute without one, the band may be 0 wide, never one-sided
                    assert r["error_low"] <= 0 <= r["error_high"]
                    assert (1 + r["error_low"]) * (1 + r["error_high"]) == pytest.approx(1.0)
                else:
                    assert r["error_low"] < 0 < r["error_high"]
            assert m["summary"]["regime"]["name"] in ("quiet", "busy", "loaded", "unmeasured")
            assert set(m["summary"]["pass"]) >= {"inside_interval"} or m["summary"]["regime"]["name"] == "quiet"
            (cap,) = m["capacity"]
            assert cap["sessions"] == [2] and cap["target_tokens_per_s"] == 50.0
            assert f"| {e['name']} | {e['class']} | {mode}: " in text
            # the host's CPUs the predicted reads take at fio's own CPU per read; fio writes usr/sys_cpu, but a
            # 0.1 s job on a busy machine can be charged no CPU time at all: then no figure and no host line
            # -- a memory-backed device (tmpfs) at the engine's pread from tmpfs, the CPU profile's, instead
            memory = is_memory(figs) or e["class"] == "tmpfs"
            if figs["qd1_cpu_per_read_us"] is None and not memory:
                assert "host_cpu" not in m and f"{e['name']} {mode}: host-bound" not in text
                continue
            h = m["host_cpu"]
            want = engine_profile()["memory_read_cpu_us"] if memory else figs["qd1_cpu_per_read_us"]
            assert h["cpu_per_read_us"] == pytest.approx(want) and h["cpu_per_read_us"] > 0
            assert h["cpu_source"] == ("the engine's pread from tmpfs," if memory else "fio's")
            assert set(h["shares"]) == {r["config"] for r in rows}
            assert h["bound"] == [k for k, v in h["shares"].items() if v >= HOST_BOUND_SHARE]
            assert (f"{e['name']} {mode}: host-bound" in text) == bool(h["bound"])
    # fio again after each device's runs (sim.measure.devices), and every mode predicted from it too: each run
    # judged against the span between the two predictions, in the verdict cell beside the first's
    for e, d in zip(res["devices"], devices):
        if not e["built"]:
            continue
        size = d["read_size"]
        assert d["fio_after"] == {str(size): str(Path(d["folder"]) / f"fio-{size}-after.json")}
        assert d["fio_after_skipped"] == ""
        fb = fio_figures(check_fio(measured / d["fio"][str(size)], size))
        fa = fio_figures(check_fio(measured / d["fio_after"][str(size)], size))
        assert e["fio_after"]["qd1_mean_us"] == [pytest.approx(fb["qd1_mean_us"]), pytest.approx(fa["qd1_mean_us"])]
        assert e["fio_after"]["peak_iops"] == [pytest.approx(fb["peak_iops"]), pytest.approx(fa["peak_iops"])]
        assert f"{e['name']}: fio again after its runs (fio-{size}-after.json): QD1 mean" in text
        for mode, m in e["modes"].items():
            if m["refused"]:
                continue
            b = e["fio_after"]["modes"][mode]
            assert after_text(e, mode) in text and after_text(e, mode)
            if b["refused"]:
                continue
            assert [r["config"] for r in b["rows"]] == [r["config"] for r in m["rows"]]
            for r, ra in zip(m["rows"], b["rows"]):
                lo, hi = sorted([r["error"], ra["error"]])
                assert ra["span_error"] == (0.0 if lo <= 0 <= hi else lo if lo > 0 else hi)
    # the report's section: a row per built device and description, the devices built and skipped
    doc = Doc("t")
    devices_section(doc, Inputs(planner=res))
    md = doc.markdown()
    assert "Planner mode on devices made here" in md and "Devices built: " + ", ".join(res["built"]) in md
    for e in res["devices"]:
        if e["built"]:
            for label in ("| fio |", "| datasheet |"):
                assert f"| {e['name']} | {e['class']} {label}" in md
            for line in datasheet_notes(e) + host_notes(e) + after_notes(e):
                assert line in md and _plain_line(line) in text
        else:
            assert f"Skipped {e['name']}: {e['reason']}" in md
    # per class: the errors of its devices' configurations pooled
    for cls, modes in res["classes"].items():
        for mode, c in modes.items():
            errs = [r["error"] for e in res["devices"] if e["class"] == cls and e["built"]
                    for r in (e["modes"].get(mode) or e.get("today") or {}).get("rows", [])]
            assert c["configurations"] == len(errs) and c["max_abs_error"] == pytest.approx(np.abs(errs).max())
    # the host (sim.decode.host): the runs' machine's CPUs, the engine's shipped profile, a read's CPU from fio's
    # own figures (fio mode), the profile's (datasheet), its pread from tmpfs on a memory-backed device; --no-host: the
    # drive alone
    prof = engine_profile()
    cores = json.loads((measured / devices[0]["folder"] / "runs.json").read_text())["machine"]["cores"]
    bare = planner_crosscheck(measured, measured / "planner-nohost.json", sim_steps=300, host=False)
    for e, b in zip(res["devices"], bare["devices"]):
        for mode, m in e["modes"].items():
            if m["refused"]:
                continue
            hm = m["host_model"]
            assert hm["cpus"] == cores and hm["step_cpu_us"] == pytest.approx(prof["step_cpu_us"])
            d = next(x for x in devices if x["name"] == e["name"])
            figs = fio_figures(check_fio(measured / d["fio"][str(d["read_size"])], d["read_size"]))
            if is_memory(figs) or e["class"] == "tmpfs":
                # a memory copy (tmpfs): the profile's pread from tmpfs in both modes, not fio's nor a drive's
                assert hm["read_cpu_us"] == pytest.approx(prof["memory_read_cpu_us"])
                assert "pread from tmpfs" in hm["source"]
            elif mode == "datasheet" or figs["qd1_cpu_per_read_us"] is None:
                assert hm["read_cpu_us"] == pytest.approx(prof["read_cpu_us"] * prof["read_cpu_ratio"])
            else:
                assert hm["read_cpu_us"] == pytest.approx(figs["qd1_cpu_per_read_us"] * prof["read_cpu_ratio"])
            assert "host_model" not in b["modes"][mode]
            # predicted again from fio after the runs: fio's CPU a read from that file, in fio mode
            ha = (e["fio_after"]["modes"][mode].get("host_model") or {}).get("read_cpu_us")
            fa = fio_figures(check_fio(measured / d["fio_after"][str(d["read_size"])], d["read_size"]))
            if not (is_memory(figs) or e["class"] == "tmpfs") and mode == "fio" and fa["qd1_cpu_per_read_us"]:
                assert ha == pytest.approx(fa["qd1_cpu_per_read_us"] * prof["read_cpu_ratio"])
            elif not e["fio_after"]["modes"][mode].get("refused"):
                assert ha == pytest.approx(hm["read_cpu_us"])
            # the host only ever slows a drive's prediction down; a memory copy's reads are the host's copies on it
            # (HostCPU.copy_reads), not fio's hand-off latency, and it says so
            memory = is_memory(figs) or e["class"] == "tmpfs"
            for r, rb in zip(m["rows"], b["modes"][mode]["rows"]):
                assert r["config"] == rb["config"] and (memory or r["predicted"] <= rb["predicted"] * 1.02)
            assert not memory or "on the host its reads are copies" in e["memory_backed"]


def test_datasheet_strings_known_answers():
    fig = {"qd1_mean_us": 249.4, "qd1_p50_us": 51.2, "peak_iops": 4003.0, "peak_qd": 16, "depths": [1, 16]}
    raw = {"qd1_mean_us": 80.0, "qd1_p50_us": 50.0, "peak_iops": 42000.0, "peak_qd": 64, "depths": [1, 64]}
    spec, fallback, rules = datasheet_spec(fig, raw, throttled=True)
    # the drive behind the volume reads as the raw disk does: its QD1 mean, not the volume's median
    assert spec == "ssd:qd1_us=80.0,iops=42000,cap_iops=4003,burst_ios=400,routing=random" and "raw disk" in rules["qd1_us"]
    assert fallback == "ssd:qd1_us=249.9,iops=4003" and set(rules) == {"qd1_us", "iops", "cap_iops", "burst_ios", "routing"}
    # without the raw disk's fio: the volume's QD1 median (the reads that did not wait)
    assert datasheet_spec(fig, None, throttled=True)[0] == "ssd:qd1_us=51.2,iops=4003,cap_iops=4003,burst_ios=400,routing=random"
    # a memory copy (QD1 median below 15 us): fio's one job's IOPS scaled to the readers' CPUs, said
    mem = {"qd1_mean_us": 25.1, "qd1_p50_us": 6.9, "peak_iops": 54612.0, "peak_qd": 16, "depths": [1, 16], "jobs": 1}
    spec, _, rules = datasheet_spec(mem, cpus=2)
    assert spec == "ssd:qd1_us=25.1,iops=109224,routing=random" and "memory copy" in rules["iops"] and "assumed" in rules["iops"]
    assert datasheet_spec(dict(mem, qd1_p50_us=40.0), cpus=2)[0] == "ssd:qd1_us=25.1,iops=54612,routing=random"
    # no raw disk above the cap: the throttle does not bind, and iops is the cap itself
    spec, _, rules = datasheet_spec(fig, dict(raw, peak_iops=3000.0), throttled=True)
    assert ",iops=4003,cap_iops=4003," in spec and "does not bind" in rules["iops"]
    assert datasheet_spec(raw)[:2] == ("ssd:qd1_us=80.0,iops=42000,routing=random", None)


def test_host_cpu_known_answers():
    """share = tokens/s x sessions x rows a step x CPU per read / CPUs: one session at 175 tokens/s, 48 rows,
    10.7 us on 2 CPUs = 0.045; 16 at 166 = 0.682 and 32 at 129 = 1.06 (the quiet VM's disk, BENCHMARKS.md) are
    host-bound, the rest's errors summed apart; rows a step from the runs (here 40 for "c"), 48 where missing."""
    runs = {"machine": {"cores": 2}, "runs": [{"config": "a", "rows_distinct_mean": 48.0},
                                              {"config": "c", "rows_distinct_mean": 40.0},
                                              {"config": "c", "rows_distinct_mean": None}]}
    rows = [{"config": "a", "sessions": 1, "predicted": 175.0, "error": 0.042},
            {"config": "b", "sessions": 16, "predicted": 166.0, "error": 0.27},
            {"config": "c", "sessions": 32, "predicted": 129.0, "error": 0.61},
            {"config": "d", "sessions": 8, "predicted": 174.0, "error": -0.065}]
    h = host_cpu({"qd1_cpu_per_read_us": 10.7}, runs, rows)
    assert h["shares"]["a"] == pytest.approx(175 * 48 * 10.7e-6 / 2)
    assert h["shares"]["b"] == pytest.approx(166 * 16 * 48 * 10.7e-6 / 2) == pytest.approx(0.682, abs=1e-3)
    assert h["shares"]["c"] == pytest.approx(129 * 32 * 40 * 10.7e-6 / 2)
    assert h["bound"] == ["b", "c"] and h["cores"] == 2 and h["bound_share"] == HOST_BOUND_SHARE == 0.5
    assert h["free"] == {"configurations": 2, "median_abs_error": pytest.approx(0.0535), "max_abs_error": 0.065}
    assert "upper bound" in h["rule"] and "10.7 us" in h["rule"]
    assert host_cpu({"qd1_cpu_per_read_us": None}, runs, rows) is None
    everything = host_cpu({"qd1_cpu_per_read_us": 1000.0}, runs, rows)
    assert len(everything["bound"]) == 4 and everything["free"] is None
    # fio_figures carries fio's QD1 CPU per read
    recs = [{"qd": 1, "iops": 40000.0, "mean": 25e-6, "pct": {50.0: 24e-6}, "cpu_s": 0.43, "ios": 40000.0},
            {"qd": 4, "iops": 99000.0, "mean": 40e-6, "pct": {50.0: 39e-6}, "cpu_s": 0.56, "ios": 99000.0}]
    assert fio_figures(recs)["qd1_cpu_per_read_us"] == pytest.approx(10.75)


def test_planner_compute():
    assert planner_compute("sleep:5").mean == pytest.approx(5e-3)
    assert planner_compute("sleep:5+spin:1.5").mean == pytest.approx(6.5e-3)
    assert planner_compute("none").mean == 0.0
    for spec in ("mixer", "blas:4", "mixer+sleep:5"):
        with pytest.raises(ArgumentError, match="only from a microbenchmark"):
            planner_compute(spec)


def _fio_copy(src, dst, **change):
    docs = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    for d in docs:
        for j in d["jobs"]:
            j["job options"].update(change.get("options", {}))
            if "write_ios" in change:
                j["write"]["total_ios"] = change["write_ios"]
    dst.write_text("\n".join(json.dumps(d) for d in docs))
    return dst


@pytest.fixture(scope="module")
def fio_only(tmp_path_factory):
    """A device list with the disk and a real fio file beside it (no runs: the refusals come before them)."""
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    d = tmp_path_factory.mktemp("planner-fio")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=6),
                      synth.Fill(projections=False), progress=False)
    size = engine_read_size(path)[0]
    fio_json(path, d / f"fio-{size}.json", size, depths=(1, 4), seconds=0.1)
    (d / "devices.json").write_text(json.dumps({
        "schema": "engram.devices/1", "kind": "devices", "read_size": size, "devices": [
            {"name": "disk", "class": "disk", "built": True, "measured": True, "folder": ".", "read_size": size,
             "fio": {str(size): f"fio-{size}.json"}}]}))
    return d


def test_refusals(fio_only, tmp_path, capsys):
    measured = fio_only
    devices = json.loads((measured / "devices.json").read_text())["devices"]
    disk = devices[0]
    src = measured / disk["fio"][str(disk["read_size"])]
    before = (measured / "planner.json").read_bytes() if (measured / "planner.json").exists() else None
    # fio of writes
    w = _fio_copy(src, tmp_path / "w.json", options={"rw": "randwrite"}, write_ios=1000)
    with pytest.raises(FormatError, match="fio of writes"):
        check_fio(w, disk["read_size"])
    line = cli(capsys, ["crosscheck", str(measured), "--planner", "--fio", f"disk={w}", "--no-progress"])
    assert "fio of writes" in line and str(w) in line
    # fio at another block size than the engine reads
    other = 4096 if disk["read_size"] != 4096 else 512
    b = _fio_copy(src, tmp_path / "b.json", options={"bs": str(other)})
    with pytest.raises(FormatError, match=f"block size {other}"):
        check_fio(b, disk["read_size"])
    line = cli(capsys, ["crosscheck", str(measured), "--planner", "--fio", f"disk={b}", "--no-progress"])
    assert f"--bs={disk['read_size']}" in line
    # no QD1 run: no datasheet latency
    with pytest.raises(FormatError, match="queue depth 1"):
        fio_figures([r for r in check_fio(src, disk["read_size"]) if r["qd"] != 1])
    # a device the measurement does not have, bad --fio text, no device list
    assert "no device 'nvme'" in cli(capsys, ["crosscheck", str(measured), "--planner", "--fio", f"nvme={src}"])
    assert "DEVICE=FILE" in cli(capsys, ["crosscheck", str(measured), "--planner", "--fio", str(src)])
    assert "no device list" in cli(capsys, ["crosscheck", str(tmp_path), "--planner"])
    assert "belongs to --planner" in cli(capsys, ["crosscheck", str(measured), "--fio", f"disk={src}"])
    after = (measured / "planner.json").read_bytes() if (measured / "planner.json").exists() else None
    assert after == before  # refused before anything was written


@pytest.mark.parametrize("change, why", [
    ({"devices": 3}, "no 'devices' list"),
    ({"devices": [3]}, "devices[0] is not an object"),
    ({"devices": [{"name": "", "class": "disk"}]}, "devices[0].name = '' is not a device name"),
    ({"devices": [{"name": "d", "class": "disk"}, {"name": "d", "class": "disk"}]}, "devices[1].name = 'd' is given twice"),
    ({"devices": [{"name": "d", "class": "nvme"}]}, "(d).class = 'nvme': expected one of disk, throttled, tmpfs"),
    ({"devices": [{"name": "d", "class": "disk", "built": "yes"}]}, "(d).built = 'yes' is not true or false"),
    ({"devices": [{"name": "d", "class": "disk", "built": True, "measured": True, "folder": "/etc"}]},
     "(d).folder = '/etc' is not a folder inside the measurement"),
    ({"devices": [{"name": "d", "class": "disk", "built": True, "measured": True, "folder": "../x"}]},
     "(d).folder = '../x' is not a folder inside"),
    ({"devices": [{"name": "d", "class": "disk", "read_size": 12.5}]}, "(d).read_size = 12.5 is not a whole number"),
    ({"devices": [{"name": "d", "class": "disk", "fio": ["x.json"]}]}, "(d).fio = ['x.json'] is not an object"),
    # a name that would break planner.md's table (its rows are lines) or any one-line message
    ({"devices": [{"name": "disk\n| x | y |", "class": "disk"}]},
     "devices[0].name = 'disk\\n| x | y |' holds a control character"),
    ({"devices": [{"name": "d\x1b[2J", "class": "disk"}]}, "devices[0].name = 'd\\x1b[2J' holds a control character"),
    # a fio file outside the measurement, as its folder
    ({"devices": [{"name": "d", "class": "disk", "fio": {"4096": "../../etc/x"}}]},
     "devices[0] (d).fio['4096'] = '../../etc/x' is not a file inside the measurement"),
    ({"devices": [{"name": "d", "class": "disk", "fio": {"4096": "/etc/passwd"}}]},
     "devices[0] (d).fio['4096'] = '/etc/passwd' is not a file inside the measurement"),
    ({"devices": [{"name": "d", "class": "disk", "fio": {"4096": "runs/../../x.json"}}]},
     "(d).fio['4096'] = 'runs/../../x.json' is not a file inside the measurement"),
    ({"devices": [{"name": "d", "class": "disk", "fio": {"4096": "fio\n.json"}}]},
     "(d).fio['4096'] = 'fio\\n.json' is not a file inside the measurement"),
    ({"read_size": 100, "devices": [{"name": "d", "class": "disk"}]}, "read_size = 100 is not a whole number"),
    # the fio taken after the runs: checked as the fio before them
    ({"devices": [{"name": "d", "class": "disk", "fio_after": "x.json"}]}, "(d).fio_after = 'x.json' is not an object"),
    ({"devices": [{"name": "d", "class": "disk", "fio_after": {"4096": "../x.json"}}]},
     "devices[0] (d).fio_after['4096'] = '../x.json' is not a file inside the measurement"),
])
def test_a_malformed_device_list_gets_one_line(tmp_path, capsys, change, why):
    (tmp_path / "devices.json").write_text(json.dumps({"schema": "engram.devices/1", "kind": "devices", **change}))
    assert why in cli(capsys, ["crosscheck", str(tmp_path), "--planner", "--no-progress"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["devices.json"]


def test_an_empty_throttle_list_is_refused(tmp_path, capsys):
    assert "--throttle-iops: no rate given" in cli(capsys, ["measure", str(tmp_path / "w"), "--throttle-iops", ""])
    assert "--throttle-iops: no rate given" in cli(capsys, ["demo", "--workdir", str(tmp_path / "d"),
                                                            "--throttle-iops", ","])
    assert not list(tmp_path.iterdir())


def test_idle_jobs_thinktime_job_or_global():
    job = {"jobname": "a", "job options": {"rw": "randread"}}
    assert idle_jobs([{"fio version": "fio-3.33", "jobs": [job]}]) == []
    assert idle_jobs([{"fio version": "fio-3.33", "global options": {"thinktime": "5ms"}, "jobs": [job]}]) == ["a"]
    tt = {"jobname": "b", "job options": {"thinktime": "5000us", "thinktime_blocks": "48"}}
    assert idle_jobs([{"fio version": "fio-3.33", "jobs": [job, tt]}]) == ["b"]
    assert idle_jobs([{"fio version": "fio-3.33", "jobs": [{"jobname": "c", "job options": {"thinktime": "0"}}]}]) == []


def test_host_cpu_refuses_bad_figures():
    """A runs document's machine.cores of the wrong kind was taken as 1 CPU (doubling the shares on 2), a
    rows_distinct_mean string or NaN as 48 rows, sessions 0 as 1; NaN sessions raised ValueError, a row without a
    config KeyError.  A row without a prediction has no share; a rows_distinct_mean of 0 is a share of 0."""
    fig = {"qd1_cpu_per_read_us": 10.7}
    runs = {"machine": {"cores": 2}, "runs": [{"config": "a", "rows_distinct_mean": 48.0}]}
    rows = [{"config": "a", "sessions": 1, "predicted": 175.0, "error": 0.042}]
    for machine, shown in (({"cores": "2"}, "'2'"), ({"cores": 0}, "0"), ({"cores": 2.0}, "2.0"),
                           ({"cores": True}, "True")):
        with pytest.raises(FormatError, match=rf"^machine\.cores = {shown}: expected a whole number of CPUs in "
                                              r"\[1, 4096\] \(or null: not recorded\)$"):
            host_cpu(fig, dict(runs, machine=machine), rows)
    with pytest.raises(FormatError, match=r"^machine = 'x': expected a JSON object$"):
        host_cpu(fig, dict(runs, machine="x"), rows)
    assert host_cpu(fig, dict(runs, machine={"cores": np.int64(2)}), rows)["cores"] == 2
    assert host_cpu(fig, dict(runs, machine={"cores": None}), rows)["cores"] == 1
    for v in ("48", float("nan"), -4.0):
        with pytest.raises(FormatError, match=rf"^runs\[0\] \(a\)\.rows_distinct_mean = {v!r}: expected a finite "
                                              r"number >= 0 \(distinct rows a step\)$"):
            host_cpu(fig, dict(runs, runs=[{"config": "a", "rows_distinct_mean": v}]), rows)
    assert host_cpu(fig, dict(runs, runs=[{"config": "a", "rows_distinct_mean": 0}]), rows)["shares"] == {"a": 0.0}
    for key, v, want in (("sessions", 0, "a whole number >= 1"), ("sessions", float("nan"), "a whole number >= 1"),
                         ("sessions", 2.7, "a whole number >= 1"),
                         ("predicted", -5.0, r"a finite number >= 0 \(tokens/s\) or None"),
                         ("predicted", float("inf"), r"a finite number >= 0 \(tokens/s\) or None"),
                         ("error", "x", r"a number \(the tokens/s error\) or None")):
        with pytest.raises(ArgumentError, match=rf"^host_cpu: rows\[0\] \(a\)\.{key} = {v!r}: expected {want}$"):
            host_cpu(fig, runs, [dict(rows[0], **{key: v})])
    with pytest.raises(ArgumentError, match=r"^host_cpu: rows\[0\]: expected a mapping with a 'config' key"):
        host_cpu(fig, runs, [{"sessions": 1, "predicted": 1.0, "error": 0.0}])
    for cpu in ("x", float("nan"), 0.0):
        with pytest.raises(ArgumentError, match=r"^host_cpu: fig qd1_cpu_per_read_us = .*: expected a finite "
                                                r"number > 0 \(microseconds\) or None$"):
            host_cpu({"qd1_cpu_per_read_us": cpu}, runs, rows)
    two = rows + [{"config": "b", "sessions": 2, "predicted": None, "error": None},
                  {"config": "c", "sessions": 2, "predicted": 10.0, "error": float("nan")}]
    h = host_cpu(fig, runs, two)
    assert set(h["shares"]) == {"a", "c"} and h["free"]["configurations"] == 1
    # a memory-backed device: the engine's CPU a read from tmpfs (the profile's) instead of fio's, said so
    m = host_cpu(fig, runs, two, memory_read_cpu_us=fig["qd1_cpu_per_read_us"] / 4)
    assert m["cpu_source"] == "the engine's pread from tmpfs," and h["cpu_source"] == "fio's"
    assert all(m["shares"][k] == pytest.approx(h["shares"][k] / 4) for k in h["shares"])
    assert "the engine's CPU a read from tmpfs" in m["rule"]
    e = {"name": "tmpfs", "modes": {"fio": {"host_cpu": dict(m, bound=["a"])}}}
    assert "CPU(s) at the engine's pread from tmpfs, " in host_notes(e)[0]


def test_host_notes_on_an_older_or_partial_planner_document():
    """planner.json without host_cpu gives no line; a partial host_cpu prints '?' where a figure is missing (each
    missing key raised KeyError in host_notes, markdown_table and the report's devices section)."""
    full = {"cpu_per_read_us": 10.7, "cores": 2, "bound_share": 0.5, "shares": {"b": 0.68, "c": 1.06},
            "bound": ["b", "c"], "free": {"configurations": 2, "median_abs_error": 0.0535, "max_abs_error": 0.065}}
    mode = {"device": "fio.json", "summary": {}, "capacity": [], "rows": []}

    def res(h):
        e = {"name": "disk", "class": "disk", "built": True, "modes": {"fio": dict(mode, host_cpu=h)}}
        return {"devices": [e], "classes": {}, "built": ["disk"], "skipped": {}}

    line = ("disk fio: host-bound (the predicted reads take >= 0.5 of the 2 CPU(s) at fio's 10.7 us a read): "
            "b (0.68 of them), c (1.06 of them): upper bounds; the other configurations: 2, median abs error 5.3%, max 6.5%.")
    assert host_notes(res(full)["devices"][0]) == [line]
    partial = {k: v for k, v in full.items() if k not in ("cores", "cpu_per_read_us")}
    partial.update(shares={"b": 0.68}, free={"configurations": 2})
    want = ("disk fio: host-bound (the predicted reads take >= 0.5 of the ? CPU(s) at fio's ? us a read): "
            "b (0.68 of them), c (? of them): upper bounds; the other configurations: 2, median abs error -, max -.")
    for h, lines in ((partial, [want]), (None, []), ([1], []), (dict(full, bound="bc"), [])):
        doc = res(h)
        assert host_notes(doc["devices"][0]) == lines
        assert all(x in markdown_table(doc) for x in lines)
        d = Doc("t")
        devices_section(d, Inputs(planner=doc))
        assert all(x in d.markdown() for x in lines)
    # a mode that modelled the host: its predictions there are the host's, not upper bounds
    doc = res(full)
    doc["devices"][0]["modes"]["fio"]["host_model"] = {"cpus": 2, "source": "2 CPUs (the runs' machine); ..."}
    assert host_notes(doc["devices"][0]) == [line.replace(
        ": upper bounds;", ": predicted on the host (2 CPUs (the runs' machine); ...);")]
    doc["devices"][0]["modes"]["fio"]["host_model"] = {"cpus": 2}
    assert "predicted on the host (?)" in host_notes(doc["devices"][0])[0]
    older = res(None)
    older["devices"][0]["modes"]["datasheet"] = None
    assert "| disk | disk | fio: `fio.json` |" in markdown_table(older)


def test_the_planners_host_says_an_assumed_cpu_count():
    """runs.json without machine.cores: the host is modelled on 1 CPU and says it is assumed; with cores
    recorded, it says the runs' machine; a fio figure of CPU per read is taken x the profile's ratio."""
    prof = engine_profile()
    figs = {"disk": {"qd1_cpu_per_read_us": 10.0, "qd1_mean_us": 50.0, "qd1_p50_us": 45.0, "peak_iops": 1e5,
                     "peak_qd": 64, "jobs": 1}}
    pl = _Planner(None, {}, figs, None, None, 0, False, None, prof)
    h = pl.host({"name": "disk"}, "fio", {"runs": []})
    assert h.cpus == 1 and "1 CPUs (assumed: the runs did not record machine.cores)" in h.source
    assert h.read_cpu_s == pytest.approx(10e-6 * prof["read_cpu_ratio"])
    h = pl.host({"name": "disk"}, "datasheet", {"machine": {"cores": 2}, "runs": []})
    assert h.cpus == 2 and "2 CPUs (the runs' machine)" in h.source
    assert h.read_cpu_s == pytest.approx(prof["read_cpu_us"] * prof["read_cpu_ratio"] * 1e-6)
    assert _Planner(None, {}, figs, None, None, 0, False, None, None).host({"name": "disk"}, "fio", {}) is None


DATA = Path(__file__).parent / "data"


def test_a_fio_cpu_figure_past_a_second_a_read_names_the_file_and_the_job(tmp_path):
    """The disk's QD1 job with a run time of 1,000,000 s: 21.5% of it over its 28,393 reads is 7.58 s of CPU a read.
    The planner's check of the fio file refuses it naming the file, the job, its depth and the figure (the host it
    models from fio's CPU per read raised naming ``HostCPU.read_cpu_s`` or a step's CPU, without the file)."""
    docs = read_fio_output(DATA / "fio-disk-randread-4k.json")
    docs[0]["jobs"][0]["job_runtime"] = 10 ** 9
    p = tmp_path / "fio-4096.json"
    p.write_text("\n".join(json.dumps(d) for d in docs))
    with pytest.raises(FormatError, match=r"fio-4096\.json: jobs\[0\] \(job 'qd1', depth 1\): \(usr_cpu \+ sys_cpu\) "
                                          r"x job_runtime / read\.total_ios = 7\.58 s of CPU a read: more than 1 s"):
        check_fio(p, 4096)


def test_a_name_with_a_pipe_stays_in_its_cell():
    """A ``|`` in a device name (or a fio file's) is escaped in planner.md's tables (``\\|``, as GitHub's tables
    read it), so every row keeps its columns; a control character in a name is refused when devices.json is read
    (test_a_malformed_device_list_gets_one_line)."""
    mode = {"refused": None, "device": "/x/fio|512.json", "capacity": [],
            "summary": {"configurations": 2, "regime": {"name": "quiet"}, "passed": True}}
    res = {"devices": [{"name": "nvme|0", "class": "disk", "built": True, "modes": {
        "fio": mode, "datasheet": {"refused": "a | b", "device": "ssd:x", "capacity": [], "summary": {}}}}],
        "classes": {"disk": {"fio": {"devices": ["nvme|0"], "configurations": 2, "median_abs_error": 0.01,
                                     "max_abs_error": 0.02}}}, "built": ["nvme|0"], "skipped": {}}
    text = markdown_table(res)
    rows = [x for x in text.splitlines() if x.startswith("| ")]
    assert len(rows) == 5
    cells = [len(re.split(r"(?<!\\)\|", x)) - 2 for x in rows]
    assert cells == [9, 9, 9, 6, 6]
    assert "| nvme\\|0 | disk | fio: `fio\\|512.json` |" in text and "refused: a \\| b |" in text
    assert "| disk | fio | nvme\\|0 | 2 |" in text


def test_a_read_size_given_once_for_every_device(tmp_path):
    """devices.json's top-level ``read_size`` serves every device without its own, in the check, in the fio file
    chosen and checked and in the fio device the planner loads (which took 4096 bytes, refusing fio of the
    512-byte reads the check had just taken, and stopped the run)."""
    fio = tmp_path / "fio-512.json"
    fio.write_text((DATA / "fio-throttled-15000-near-qd1-randread-512.json").read_text())
    doc = {"schema": "engram.devices/1", "kind": "devices", "read_size": 512, "devices": [
        {"name": "vol", "class": "disk", "built": True, "measured": True, "folder": ".", "fio": {"512": fio.name}},
        {"name": "own", "class": "disk", "built": True, "measured": True, "folder": ".", "read_size": 4096,
         "fio": {"4096": "fio-4096.json"}},
        {"name": "null", "class": "disk", "read_size": None}]}
    (tmp_path / "devices.json").write_text(json.dumps(doc))
    devices = check_devices(doc, tmp_path / "devices.json")
    assert [d.get("read_size") for d in devices] == [512, 4096, 512]
    assert "read_size" not in doc["devices"][0]  # the document read is left as it was
    figs, files = _fio_files(tmp_path, devices[:1], {})
    assert files == {"vol": fio} and figs["vol"]["depths"] == [1, 2, 4, 8, 16, 32, 64]
    pl = _Planner(tmp_path, files, figs, None, None, 0, False, None, None)
    entry = {"modes": {}}
    dev, described = pl._device(entry, devices[0], "fio", "ssd:qd1_us=60,iops=15000", None, None)
    assert described == f"fio:{fio},assume_bs=512" and entry["modes"] == {}
    assert dev.derived["block_size"]["value"] == 512.0


def test_free_text_of_devices_json_stays_on_its_line():
    """A reason or a fio message of devices.json (the measurement's free text) with a newline or an escape is shown
    on its line, a control character as a space: no line of its own, no table row, no terminal sequence."""
    from sim.check.planner import markdown_table

    res = {"devices": [{"name": "disk", "class": "disk", "built": True, "modes": {}, "left_out": {},
                        "reason": "no fio beside its runs: y\x1b[2J\n| a | b |"}],
           "classes": {}, "built": ["disk"], "skipped": {"vol": "x\x1b[31m\nsaved /etc/passwd"}}
    text = markdown_table(res)
    assert "\x1b" not in text and "\nsaved /etc/passwd" not in text and "\n| a | b |" not in text
    assert "Skipped: vol (x [31m saved /etc/passwd)." in text.splitlines()
    assert "disk: no fio beside its runs: y [2J | a | b |." in text.splitlines()


def test_a_fio_file_of_another_read_size_is_said():
    """A device whose fio was recorded only at another block size than its read size is left out saying so, naming
    the fio entry and the read size (it said "not recorded")."""
    d = {"name": "disk", "class": "disk", "built": True, "measured": True, "folder": ".", "read_size": 512,
         "fio": {"4096": "fio-4096.json"}}
    pl = _Planner(Path("."), {}, {}, None, None, 0, False, None, None)
    assert pl.entry(d)["reason"] == ("no fio beside its runs: fio recorded at fio['4096'], not at the engine's read "
                                     "size 512 B (disk.read_size)")
    assert pl.entry({**d, "fio": {}})["reason"] == "no fio beside its runs: not recorded"


def _rows(*pairs):
    return {"device": "x", "rows": [{"config": f"c{i}", "sessions": i + 1, "mode": "threads", "predicted": p, "error": e}
                                    for i, (p, e) in enumerate(pairs)]}


def test_between_fio_before_and_after_known_answers():
    # c0: measured between the two predictions (errors of opposite signs): 0 against the span; c1: both too fast,
    # the nearer (+0.04) counts; c2: both too slow, the nearer (-0.02); c3: after's prediction missing: left out
    before = _rows((110.0, 0.10), (104.0, 0.04), (98.0, -0.02), (100.0, 0.01))
    after = {"device": "y", "rows": [{"config": "c0", "predicted": 95.0, "error": -0.05},
                                     {"config": "c1", "predicted": 120.0, "error": 0.20},
                                     {"config": "c2", "predicted": 90.0, "error": -0.10}]}
    b = between(before, after)
    assert [r["span_error"] for r in b["rows"]] == [0.0, 0.04, -0.02]
    assert [r["config"] for r in b["rows"]] == ["c0", "c1", "c2"]
    assert b["span"] == {"configurations": 3, "median_abs_error": pytest.approx(0.02),
                         "max_abs_error": pytest.approx(0.04), "passed": True}
    assert b["tokens_per_s"] == {"median_abs_error": pytest.approx(0.10), "max_abs_error": pytest.approx(0.20)}
    # apart: |95/110 - 1|, |120/104 - 1|, |90/98 - 1|
    apart = sorted([abs(95 / 110 - 1), abs(120 / 104 - 1), abs(90 / 98 - 1)])
    assert b["apart"] == {"median": pytest.approx(apart[1]), "max": pytest.approx(apart[2])}
    assert b["device"] == "y"
    # a span past the planner's max fails; one past its median fails
    far = between(_rows((100.0, 0.12)), _rows((100.0, 0.15)))
    assert far["span"]["max_abs_error"] == pytest.approx(0.12) and not far["span"]["passed"]
    mid = between(_rows((100.0, 0.06), (100.0, 0.06)), _rows((100.0, 0.07), (100.0, 0.07)))
    assert mid["span"]["median_abs_error"] == pytest.approx(0.06)
    assert mid["span"]["median_abs_error"] > PLANNER_TARGETS["tokens_per_s_median_abs"]
    assert not mid["span"]["passed"]
    # nothing left: no figures, not passed; NaN, None and a zero prediction are left out
    none = between(_rows((float("nan"), 0.1), (None, 0.1), (0.0, 0.1)), _rows((1.0, 0.1), (1.0, 0.1), (1.0, 0.1)))
    assert none["span"] == {"configurations": 0, "median_abs_error": None, "max_abs_error": None, "passed": False}
    # the verdict cell's addition, and none on a partial document
    entry = {"fio_after": {"modes": {"fio": b, "datasheet": {"device": "s", "refused": "no"}}}}
    assert after_text(entry, "fio") == ("; between fio before and after: PASS (median 2.0%, max 4.0%; the two "
                                        f"predictions {apart[1] * 100:.1f}% apart, max {apart[2] * 100:.1f}%)")
    assert after_text(entry, "datasheet") == "; fio after the runs refused: no"
    assert after_notes({"name": "disk", **entry})[1:] == [
        "disk fio (fio after the runs): predicted from it: median abs error 10.0%, max 20.0% (too fast: 2 sessions "
        "as threads); between fio before and "
        f"after: PASS (median 2.0%, max 4.0%; the two predictions {apart[1] * 100:.1f}% apart, max "
        f"{apart[2] * 100:.1f}%).", "disk datasheet (fio after the runs): refused: no."]
    # a partial or older document: never raises, a missing figure reads "?"
    for partial in ({}, {"fio_after": 3}, {"fio_after": {"modes": {"fio": {}}}}, None,
                    {"fio_after": {"modes": {"fio": {"apart": "x", "span": 3}}}}, {"fio_after": {"modes": ["fio"]}},
                    {"fio_after": {"modes": {"fio": 7}}}):
        assert isinstance(after_notes(partial), list)
        assert after_text(partial, "fio") in ("", "; between fio before and after: FAIL (median -, max -; the two "
                                                  "predictions - apart, max -)")
    assert after_notes({"name": "d", "fio_after": {"file": "f.json"}})[0] == (
        "d: fio again after its runs (f.json): QD1 mean ? -> ? us, peak ? -> ? IOPS; each run is also judged against "
        "the span between the predictions from the two.")
    # fio after the runs that the planner did not use, and why
    assert after_notes({"name": "d", "fio_after_unused": "fio is not installed"}) == [
        "d: fio after its runs not used: fio is not installed."]
    # the datasheet after the runs predicted from its fallback: said, as the first prediction's is, on one line
    fell = copy.deepcopy(entry)
    fell["fio_after"]["modes"]["datasheet"] = dict(b, datasheet_fallback="'ssd:cap' refused\n(x); predicted from 's'")
    assert after_notes({"name": "disk", **fell})[-1].endswith("; 'ssd:cap' refused (x); predicted from 's'.")
    # the span's missed goal is named; the run of the second prediction's largest error and its sign are given
    far_entry = {"name": "disk", "fio_after": {"modes": {"fio": far}}}
    assert after_text(far_entry, "fio").startswith("; between fio before and after: FAIL (missed: median 12.00% > "
                                                   "5%, max 12.00% > 10%; median 12.0%, max 12.0%;")
    # just past a goal reads past it; "passed" other than true is a FAIL
    edge = copy.deepcopy(far)
    edge["span"].update(median_abs_error=0.0500004, max_abs_error=0.05, passed="false")
    assert "FAIL (missed: median 5.00% > 5%; median 5.0%" in after_text({"fio_after": {"modes": {"fio": edge}}}, "fio")
    assert [r["sessions"] for r in b["rows"]] == [r["sessions"] for r in before["rows"][:3]]
    # a device that moved between the two fio runs is said to have moved
    moved = {"name": "d", "fio_after": {"file": "f.json", "qd1_mean_us": [128.6, 42.5], "peak_iops": [14573, 145931]}}
    assert "; the device moved 10.0-fold between them: a prediction from either file holds only while" in \
        after_notes(moved)[0]
    moved["fio_after"].update(qd1_mean_us=[40.0, 44.0], peak_iops=[130000, 160000])
    assert "moved" not in after_notes(moved)[0]
    # a QD1 fio job held off its CPU, before or after the runs, is said; a number past a float's range reads "?"
    fell["fio_after"].update(qd1_held_off=[None, 0.49], qd1_mean_us=[10 ** 400, 1.0])
    first = after_notes({"name": "disk", **fell})[0]
    assert "QD1 mean ? -> 1.0 us" in first and "; fio after the runs: fio's QD1 job had a read in flight 49%" in first
    assert "fio before the runs" not in first
    for odd in (1.5, 5, -0.2, float("nan"), float("inf"), 0.95, "0.4", True):
        fell["fio_after"]["qd1_held_off"] = [odd, odd]
        assert "in flight" not in after_notes({"name": "disk", **fell})[0]


def test_the_planners_host_scales_sessions_as_processes():
    """A run of sessions as processes is predicted on the host with the profile's process_cpu_ratio times the CPU
    a step and a read; threads as the host is."""
    prof = {"step_cpu_us": 100.0, "read_cpu_us": 20.0, "process_cpu_ratio": 1.3, "process_sessions": 32}
    host = HostCPU(2, 100e-6, 17e-6, source="h", wake_s=45e-6)
    m = PlannerModels.of(ParametricSSD(80e-6, 100000, 8), "ssd", host, prof)
    t, p = m.host("sleep:5", "threads"), m.host("spin:1", "processes")
    assert t == host
    assert p.step_cpu_s == pytest.approx(130e-6) and p.read_cpu_s == pytest.approx(17e-6 * 1.3)
    assert p.spin_s == pytest.approx(1e-3) and p.wake_s == host.wake_s and "x 1.30" in p.source
    assert p.sessions == "processes" and t.sessions == "threads"
    assert PlannerModels.of(ParametricSSD(80e-6, 100000, 8), "ssd", None, prof).host("none", "processes") is None


def test_a_measured_fio_file_cut_short_is_refused(fio_only, tmp_path, capsys):
    """A fio file of the measurement must hold every depth devices.json says fio ran at: a file cut short (its
    last depths lost) is refused naming it and the depths missing; a planner's own file (--fio) need not."""
    work = tmp_path / "w"
    shutil.copytree(fio_only, work)
    doc = json.loads((work / "devices.json").read_text())
    disk = doc["devices"][0]
    size = disk["read_size"]
    lines = (work / f"fio-{size}.json").read_text().splitlines()
    (work / "cut.json").write_text(lines[0] + "\n")  # QD1 only
    doc["fio_depths"] = [1, 4]
    disk["fio_after"] = {str(size): "cut.json"}
    (work / "devices.json").write_text(json.dumps(doc))
    line = cli(capsys, ["crosscheck", str(work), "--planner", "--no-progress"])
    assert "cut.json: fio at depths [1], but the measurement ran it at [1, 4]" in line and "[4] missing" in line
    assert not (work / "planner.json").exists()
    # a fio file without a QD1 run names the file
    (work / "noqd1.json").write_text(lines[1] + "\n")
    disk["fio_after"] = {str(size): "noqd1.json"}
    doc["fio_depths"] = [4]
    (work / "devices.json").write_text(json.dumps(doc))
    line = cli(capsys, ["crosscheck", str(work), "--planner", "--no-progress"])
    assert "noqd1.json: fio output without a run at queue depth 1" in line


def test_the_table_says_the_sign_and_run_of_the_largest_error():
    """The max cell names which way the largest error ran and at which run: -25% at 32 sessions as threads is a
    prediction too slow; +14% at one session too fast; rows without a finite error are passed over."""
    rows = [{"config": "a", "sessions": 1, "mode": "threads", "error": 0.14},
            {"config": "b", "sessions": 32, "mode": "threads", "error": -0.25},
            {"config": "c", "sessions": 64, "mode": "processes", "error": float("nan")},
            {"config": "d", "sessions": 8, "mode": None, "error": None}]
    mode = {"refused": None, "device": "/x/fio.json", "capacity": [], "rows": rows,
            "summary": {"configurations": 2, "regime": {"name": "quiet"}, "passed": False,
                        "tokens_per_s": {"median_abs_error": 0.195, "max_abs_error": 0.25}}}
    res = {"devices": [{"name": "d", "class": "disk", "built": True, "modes": {"fio": mode}}],
           "classes": {}, "built": ["d"], "skipped": {}}
    assert "| 19.5% | 25.0% (too slow: 32 sessions as threads) |" in markdown_table(res)
    rows[1]["error"] = 0.01
    assert "| 25.0% (too fast: 1 session as threads) |" in markdown_table(res)
    mode["rows"] = rows[2:]
    assert "| 25.0% | -" in markdown_table(res)
    # the goals, the sign of an error and what each run is predicted at, under the tables
    assert ("Goals a device and description: tokens/s median |error| <= 5.0%, max <= 10.0%, the measured capacity "
            "within one step of the session grid of the predicted one; an error is predicted / measured - 1 (too "
            "fast: above the measurement).") in markdown_table(res)
    # a largest error of 0 has no sign; an infinite one names its run; odd documents never raise
    assert _worst({"rows": [{"error": 0.0, "sessions": 8, "mode": "threads"}]}) == ""
    assert _worst({"rows": [{"error": 0.2, "sessions": 8}, {"error": float("inf"), "sessions": 99}]}) == \
        " (too fast: 99 sessions)"
    for odd in ({"rows": 5}, "x", None, {"rows": [{"error": 10 ** 400}]}, {"rows": [{"error": "0.3"}]}):
        assert _worst(odd) == ""
    assert _worst({"rows": [{"error": -0.1, "sessions": True, "mode": 3}]}) == " (too slow: ? sessions)"


def test_datasheet_gap_known_answers():
    """fio's drive at 1,000 / 6,000 / 9,000 IOPS at QD 1 / 8 / 32; a datasheet string's device at 1,000 / 8,000 /
    9,000: it runs 8,000 / 6,000 = 1.33x fio's at QD8, said with fio's peak depth and the datasheet's knee; within
    1.2x nothing is said, nor for a memory-backed device or a partial document."""
    from sim.check.planner import DATASHEET_GAP, datasheet_gap, datasheet_notes
    from sim.device import EmpiricalDevice, LatencyDist

    def dev(iops):
        return EmpiricalDevice({q: LatencyDist.point(q / x) for q, x in iops.items()}, "d", "test")

    fio = dev({1: 1000.0, 8: 6000.0, 32: 9000.0})
    sheet = dev({1: 1000.0, 8: 8000.0, 32: 9000.0})
    sheet.derived = {"knee_qd": {"value": 8.0, "rule": "r"}}
    g = datasheet_gap(fio, sheet)
    assert g["qd"] == 8 and g["ratio"] == pytest.approx(8000 / 6000) and g["peak_qd"] == 32 and g["knee_qd"] == 8.0
    assert g["sheet_iops"] == pytest.approx(8000.0) and g["fio_iops"] == pytest.approx(6000.0)
    assert datasheet_notes({"name": "disk", "datasheet_gap": g}) == [
        "disk: the datasheet string runs 1.33x fio's IOPS at QD8 (8,000 against 6,000): its two figures (QD1 "
        "latency, peak IOPS: a knee at QD 8.0) do not follow fio's curve, which peaks at QD32; where the runs queue "
        "at such depths its predictions differ from fio's as much."]
    # slower by as much is said too; within the bound, memory-backed or partial: nothing
    slow = datasheet_gap(sheet, fio)
    assert slow["ratio"] == pytest.approx(6000 / 8000) and datasheet_notes({"name": "d", "datasheet_gap": slow})
    near = datasheet_gap(fio, dev({1: 1000.0, 8: 6000.0 * (DATASHEET_GAP - 0.01), 32: 9000.0}))
    assert datasheet_notes({"name": "d", "datasheet_gap": near}) == []
    assert datasheet_notes({"name": "d", "datasheet_gap": g, "memory_backed": "a copy"}) == []
    for partial in (None, {}, {"datasheet_gap": 3}, {"datasheet_gap": {"ratio": "x"}},
                    {"datasheet_gap": dict(g, ratio=0.0)}, {"datasheet_gap": dict(g, qd=10 ** 400)}):
        assert datasheet_notes(partial) == []
    nan, inf = float("nan"), float("inf")
    for bad in (dict(ratio=nan), dict(ratio=inf), dict(ratio=1e308), dict(qd=nan), dict(qd=0), dict(qd=-1),
                dict(qd=1e308), dict(peak_qd=0), dict(sheet_iops=-1.0), dict(fio_iops=0.0), dict(fio_iops=nan),
                dict(sheet_iops=1.0)):  # the last: its IOPS do not give its ratio
        assert datasheet_notes({"name": "d", "datasheet_gap": dict(g, **bad)}) == [], bad
    assert "knee" not in datasheet_notes({"name": "d", "datasheet_gap": dict(g, knee_qd=-1.0)})[0]

    class Odd(EmpiricalDevice):
        """A device whose IOPS fail at some depths (NaN at QD1, a division by zero at QD8)."""

        def iops(self, qd):
            if qd == 8:
                raise ZeroDivisionError("at 8")
            return float("nan") if qd == 1 else super().iops(qd)

    odd = Odd({q: LatencyDist.point(q / x) for q, x in {1: 1000.0, 8: 6000.0, 32: 9000.0}.items()}, "o", "test")
    got = datasheet_gap(odd, sheet)
    assert got["qd"] == 32 and got["peak_qd"] == 32 and got["ratio"] == pytest.approx(1.0)
    assert datasheet_gap(sheet, odd)["qd"] == 32
    for derived in ({"knee_qd": 3.0}, ["x"], {"knee_qd": {"value": "x"}}, None):
        sheet.derived = derived
        assert datasheet_gap(fio, sheet)["knee_qd"] is None


def test_a_malformed_planner_document_is_named_by_field(tmp_path):
    """``engram report`` reads planner.json back: each field its tables read is checked first, and the first one
    amiss is a FormatError naming the file and the field -- not a traceback from the table."""
    from sim.check.planner import check_planner

    mode = {"summary": {"tokens_per_s": {"median_abs_error": 0.01, "max_abs_error": 0.02}},
            "capacity": [{"mode": "threads", "all_met": {"measured": False, "predicted": False},
                          "measured_capacity": 4, "predicted_capacity": 4, "within_one_step": True}]}
    good = {"devices": [{"name": "disk", "built": True, "modes": {"fio": mode, "datasheet": {"refused": "no"}},
                         "today": copy.deepcopy(mode)}],
            "classes": {"disk": {"fio": {"median_abs_error": 0.01, "max_abs_error": 0.02}}}, "built": ["disk"],
            "skipped": {}}
    assert check_planner(good, "p.json") is good
    cases = [
        (lambda d: d.update(devices=["x"]), r"devices\[0\]: expected a JSON object, got 'x'"),
        (lambda d: d["devices"][0].pop("name"), r"devices\[0\]: name = None is not a string"),
        (lambda d: d["devices"][0].update(modes=[]), r"devices\[0\]: modes: expected a JSON object, got \[\]"),
        (lambda d: d["devices"][0]["modes"]["fio"].update(capacity=[None]),
         r"devices\[0\]\.modes\.fio: capacity\[0\]: expected a JSON object, got None"),
        (lambda d: d["devices"][0]["modes"]["fio"].update(summary="x"),
         r"devices\[0\]\.modes\.fio: summary: expected a JSON object"),
        (lambda d: d["devices"][0]["modes"]["datasheet"].update(refused=5),
         r"devices\[0\]\.modes\.datasheet: refused = 5 is not a string"),
        (lambda d: d["devices"][0]["today"]["capacity"][0].pop("mode"),
         r"devices\[0\]\.today: capacity\[0\] has no mode"),
        (lambda d: d["devices"][0]["modes"]["fio"]["summary"]["tokens_per_s"].update(max_abs_error="x"),
         r"devices\[0\]\.modes\.fio\.summary\.tokens_per_s: max_abs_error = 'x' is not a number"),
        (lambda d: d["classes"]["disk"]["fio"].update(median_abs_error=float("nan")),
         r"classes\.disk\.fio: median_abs_error = nan must be a finite number"),
        (lambda d: d.update(skipped=["a"]), r"skipped: expected a JSON object, got \['a'\]"),
        (lambda d: d["classes"]["disk"].update(fio=3), r"classes\.disk\.fio: expected a JSON object, got 3"),
        (lambda d: d["devices"][0].update(fio_file=7), r"devices\[0\]: fio_file = 7 is not a string"),
    ]
    for change, why in cases:
        bad = copy.deepcopy(good)
        change(bad)
        with pytest.raises(FormatError, match=r"^p\.json: " + why):
            check_planner(bad, "p.json")
