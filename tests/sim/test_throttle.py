"""sim.measure.throttle and sim.measure.devices: the throttled cgroup's life on this machine, a real throttled
read rate, tmpfs, and the devices a measurement builds or skips."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engram import ArgumentError, OutputError, Table, TableGroup, TableIOError, read_model, synth
from sim.device.fio import fio_records, read_fio_output
from sim.measure.devices import DevicePlan, engine_read_size, fio_json, measure_devices, on_tmpfs, plan_devices
from sim.measure.throttle import CGROUP_PREFIX, IopsThrottle, ThrottleSupport, block_device_of, throttle_support
from sim.measure import Settings
from sim.core.schema import RunConfig
from sim.trace import CODE_SOURCE
from tests.clirun import cli
from tests.modelfiles import SCALE, token_map as _token_map

REPO = Path(__file__).resolve().parents[2]


def _support(path) -> ThrottleSupport:
    s = throttle_support(path)
    if not s.ok:
        pytest.skip(f"no read throttle here: {s.reason}")
    return s


def _blkio_line(pid: int = None) -> str:
    text = Path(f"/proc/{pid or 'self'}/cgroup").read_text()
    return next((x for x in text.splitlines() if ":blkio:" in x or x.startswith("0::")), "")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small model file in the real format, on the temporary folder's disk."""
    path = tmp_path_factory.mktemp("thr") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=4),
                      synth.Fill(projections=False), progress=False)
    return path


@pytest.fixture
def disk_file(tmp_path):
    p = tmp_path / "blocks.bin"
    p.write_bytes(np.random.default_rng(3).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes())
    return p


def test_lifecycle_inside_and_removed(disk_file):
    s = _support(disk_file)
    home = _blkio_line()
    with IopsThrottle(3000, disk_file) as t:
        folder = t.folder
        assert folder.is_dir() and folder.name == f"{CGROUP_PREFIX}{os.getpid()}-3000"
        assert t.inside() and os.getpid() in [int(x) for x in (folder / "cgroup.procs").read_text().split()]
        assert t.written() == f"{s.device} 3000"          # the kernel reads the limit back
        assert folder.name in _blkio_line()
        # a process started inside (a process-mode session worker, fio) is inside too
        child = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                               capture_output=True, text=True, check=True).stdout
        assert folder.name in child
    assert not folder.exists() and _blkio_line() == home
    assert t.to_dict()["cgroup"] == str(folder) and t.to_dict()["limit"] == f"{s.device} 3000"


def test_removed_after_an_exception(disk_file):
    _support(disk_file)
    with pytest.raises(RuntimeError, match="midway"):
        with IopsThrottle(5000, disk_file) as t:
            folder = t.folder
            assert folder.is_dir()
            raise RuntimeError("midway")
    assert not folder.exists() and folder.name not in _blkio_line()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_removed_after_a_signal(disk_file, sig):
    _support(disk_file)
    code = textwrap.dedent(f"""
        import sys, time
        from sim.measure.throttle import IopsThrottle
        with IopsThrottle(2500, {str(disk_file)!r}) as t:
            print(t.folder, flush=True)
            time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO)
    folder = Path(p.stdout.readline().strip())
    assert folder.is_dir() and str(p.pid) in folder.name
    p.send_signal(sig)
    p.wait(timeout=20)
    assert p.returncode != 0 and not folder.exists()


def test_kernel_refusal_and_bad_rates(disk_file):
    s = _support(disk_file)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ArgumentError, match="whole number"):
            IopsThrottle(bad, disk_file, s)
    # /dev/null is no disk: the kernel refuses the limit; nothing is left behind
    fake = ThrottleSupport(True, "", s.version, s.parent, "1:3")
    before = sorted(p.name for p in Path(s.parent).iterdir() if p.name.startswith(CGROUP_PREFIX))
    with pytest.raises(ArgumentError, match="the kernel refused '1:3 1000'"):
        with IopsThrottle(1000, disk_file, fake):
            pass
    after = sorted(p.name for p in Path(s.parent).iterdir() if p.name.startswith(CGROUP_PREFIX))
    assert after == before


def test_cli_refuses_bad_rates(tmp_path, capsys):
    work = tmp_path / "w"
    assert "not a whole number of read IOPS" in cli(capsys, ["measure", str(work), "--throttle-iops", "0"])
    assert "given twice" in cli(capsys, ["measure", str(work), "--throttle-iops", "4000,4000"])
    assert not work.exists()  # refused before the model file is built


def test_no_device_on_tmpfs():
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    dev, why = block_device_of("/dev/shm")
    s = throttle_support("/dev/shm")
    assert dev is None and not s.ok and "no block device" in why and s.reason == why
    with pytest.raises(OutputError, match="no block device"):
        with IopsThrottle(1000, "/dev/shm"):
            pass


@pytest.mark.heavy
def test_throttled_reads_run_at_the_throttle(tmp_path, model):
    """Real reads of a table through the engine and through fio, inside a 2000-IOPS throttle: the kernel holds
    both near the rate (a loose band: the budget of a slice passes at once)."""
    path = model
    info = read_model(path)
    _support(path)
    rate = 2000
    with IopsThrottle(rate, info.tables[sorted(info.tables)[0]].path):
        locs = [info.tables[k] for k in sorted(info.tables)]
        tables = [Table(x.path, x.offset, x.rows, backend="serial") for x in locs]
        rng = np.random.default_rng(5)
        with TableGroup(tables, 24, backend="pread", readers=8, threshold=1) as g:
            out = np.empty((1, 48, 256), np.float32)
            reads, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.5:
                ids = np.concatenate([rng.integers(0, t.rows, (1, 24), dtype=np.uint32) for t in tables], axis=1)
                g.read_batch(ids, out=out)
                reads += g.last_stats.reads
            engine_rate = reads / (time.perf_counter() - t0)
        for t in tables:
            t.close()
        if shutil.which("fio") is None:
            fio_rate = None
        else:
            f = fio_json(path, tmp_path / "fio.json", 4096, depths=(16,), seconds=1.0)
            fio_rate = fio_records(read_fio_output(f))[0]["iops"]
    assert 0.6 * rate <= engine_rate <= 1.2 * rate, engine_rate
    if fio_rate is not None:
        assert 0.8 * rate <= fio_rate <= 1.1 * rate, fio_rate


def test_tmpfs_copy_read_direct_and_removed(tmp_path, model):
    path = model
    try:
        with on_tmpfs(path) as copy:
            size, direct, _ = engine_read_size(copy)
            assert direct and copy.exists() and copy.stat().st_size == path.stat().st_size
            assert block_device_of(copy)[0] is None
            assert copy.read_bytes()[:4096] == path.read_bytes()[:4096]
            where = copy.parent
    except OutputError as exc:
        pytest.skip(f"no tmpfs with O_DIRECT here: {exc}")
    assert not where.exists()


def test_plan_refuses_and_skips(tmp_path, model):
    path = model
    with pytest.raises(ArgumentError, match="given twice"):
        plan_devices(path, [3000, 3000])
    with pytest.raises(ArgumentError, match="whole number"):
        plan_devices(path, [0])
    try:
        with on_tmpfs(path) as copy:  # a model on tmpfs: no disk to throttle, skipped with the reason
            plan = plan_devices(copy, [3000])
    except OutputError as exc:
        pytest.skip(f"no tmpfs here: {exc}")
    assert [d["name"] for d in plan] == ["disk", "throttle-3000"]
    assert plan[1]["built"] is False and "no block device" in plan[1]["reason"]


@pytest.mark.heavy
def test_measurement_killed_midway_leaves_no_cgroup(tmp_path, model):
    path = model
    s = _support(path)
    work = tmp_path / "w"
    cmd = [sys.executable, "-c", "import sys; from engram.cli import main; sys.exit(main(sys.argv[1:]))",
           "measure", str(work), "--model", str(path), "--scale", str(SCALE), "--config",
           f"{CODE_SOURCE}/8/pread/4/none/400", "--rounds", "3", "--only", "runs", "--no-wait", "--no-progress",
           "--throttle-iops", "1000", "--no-fio"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    name = f"{CGROUP_PREFIX}{p.pid}-1000"
    folder = Path(s.parent) / name
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and p.poll() is None:
        if folder.is_dir() and str(p.pid) in (folder / "cgroup.procs").read_text().split():
            break
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    assert folder.is_dir()          # the run is inside its throttle now
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    assert p.returncode != 0
    assert not folder.exists()
    doc = json.loads((work / "devices.json").read_text())
    assert [d["name"] for d in doc["devices"]] == ["disk", "throttle-1000"]
    assert doc["devices"][0]["built"] is True


@pytest.mark.parametrize("field, value, words", [("fio_seconds", 0.0, "fio_seconds must be > 0, got 0.0"),
                                                   ("fio_depths", (), "fio_depths must be whole numbers >= 1"),
                                                   ("fio_depths", (1, 0), "fio_depths must be whole numbers >= 1"),
                                                   ("throttles", [0], "--throttle-iops: 0 is not a whole number")])
def test_device_plan_refuses_a_bad_value(field, value, words):
    with pytest.raises(ArgumentError, match=words):
        DevicePlan(**{field: value})


@pytest.mark.heavy
def test_measure_devices_documents(tmp_path, model):
    """A small real measurement on every device the machine allows: each said built or skipped, fio beside the
    runs at the engine's read size and 4 KiB, the device in its own documents."""
    path = model
    lines = []
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 20)]
    s = Settings(rounds=1, depths=(1, 4), fio=False, io_batches=4, io_chunks=1, big_seconds=0.01, single_rows=4,
                 compute_samples=4, warmup=2, shared_seconds=0.01, cache_batches=2)
    doc = measure_devices(path, cfgs, tmp_path / "w", s,
                          devices=DevicePlan(throttles=[6000], tmpfs=True, fio_seconds=0.1, fio_depths=(1, 4)),
                          progress=False, say=lines.append)
    saved = json.loads((tmp_path / "w" / "devices.json").read_text())
    assert saved["kind"] == "devices" and [d["name"] for d in saved["devices"]] == ["disk", "throttle-6000", "tmpfs"]
    for d in saved["devices"]:
        assert isinstance(d["built"], bool)
        if not d["built"]:
            assert d["reason"] and any(d["name"] in x and "skipped" in x for x in lines)
            continue
        folder = tmp_path / "w" / d["folder"]
        runs = json.loads((folder / "runs.json").read_text())
        assert runs["device"]["name"] == d["name"] and runs["device"]["class"] == d["class"]
        assert len(runs["runs"]) == 1 and doc["results"][d["name"]]["runs_done"] == 1
        if d["fio"]:
            assert sorted(d["fio"], key=int) == sorted({str(d["read_size"]), "4096"}, key=int)
            for bs, rel in d["fio"].items():
                recs = fio_records(read_fio_output(tmp_path / "w" / rel))
                assert [r["qd"] for r in recs] == [1, 4] and all(r["bs"] == bs for r in recs)
        else:
            assert d["fio_skipped"]
        if d["class"] == "throttled":
            assert d["throttle"]["read_back"].endswith(" 6000") and not Path(d["throttle"]["cgroup"]).exists()


def test_fio_runs_a_held_off_depth_again(tmp_path, model, monkeypatch):
    """A depth whose fio job waited for its CPU (its in-flight share below HELD_OFF_SHARE) is run again, up to
    FIO_TRIES runs, and the least held-off run is kept with the others' shares recorded.  Every real run is made
    to count as held off by raising the bar past 1; at the real bar a run of this quiet table keeps one run."""
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    import sim.measure.devices as devices

    f = fio_json(model, tmp_path / "once.json", 4096, depths=(1,), seconds=0.2)
    docs = read_fio_output(f)
    assert len(docs) == 1
    rec = fio_records(docs)[0]
    if "held_off" not in docs[0]["engram"]:
        assert rec["iops"] * rec["mean"] >= devices.HELD_OFF_SHARE
    monkeypatch.setattr(devices, "HELD_OFF_SHARE", 1.5)
    f = fio_json(model, tmp_path / "again.json", 4096, depths=(1, 4), seconds=0.2, tries=3)
    docs = read_fio_output(f)
    assert len(docs) == 2 and [fio_records([d])[0]["qd"] for d in docs] == [1, 4]
    for d in docs:
        kept = min(devices.in_flight_share(r) for r in fio_records([d]))
        assert len(d["engram"]["held_off"]) == 2 and all(0 < s <= round(kept, 3) for s in d["engram"]["held_off"])


def test_fio_json_refuses_bad_tries_and_names_a_run_without_reads(tmp_path, model, monkeypatch):
    """``tries`` is a whole number >= 1, checked before fio runs; fio output with no completed read (a run whose
    jobs read nothing) is a TableIOError naming the file, the block size and the depth, which the measurement
    records as fio skipped on that device, and nothing is written."""
    import sim.measure.devices as devices

    for bad in (0, -1, True, "3", None, 2.0):
        with pytest.raises(ArgumentError, match="tries = .*expected a whole number >= 1"):
            fio_json(model, tmp_path / "x.json", 4096, depths=(1,), tries=bad)
    for kw, why in ((dict(bs=0), "bs = 0: expected a block size"), (dict(bs=4096, depths=()), "no queue depth")):
        with pytest.raises(ArgumentError, match=why):
            fio_json(model, tmp_path / "x.json", **{"depths": (1,), **kw})
    assert not (tmp_path / "x.json").exists()
    empty = {"fio version": "fio-3.33", "global options": {}, "jobs": [
        {"jobname": "engram-randread", "job options": {"iodepth": "1"}, "read": {"total_ios": 0, "iops": 0},
         "write": {"total_ios": 0}}]}
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/fio")
    monkeypatch.setattr(devices.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 0, stdout=json.dumps(empty), stderr=""))
    with pytest.raises(TableIOError, match=r"fio on .* at bs 4096, qd 1: its output is unusable: .*no read job"):
        fio_json(model, tmp_path / "none.json", 4096, depths=(1,))
    assert not (tmp_path / "none.json").exists()
