"""Bad input to the simulator, one test per kind: each is refused before anything is allocated or written,
with an engram.EngramError naming the key, field, line or file and the value, and on the command line as one
line, exit 2, no traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram.cli import main
from engram.errors import ArgumentError, FormatError
from sim.core import limits
from sim.decode import DecodeRun, simulate_decode
from sim.device import load_device
from sim.serve.workload import Workload, make_requests
from sim.trace import load_trace
from tests.clirun import cli

GB8 = 8 * 10**9


@pytest.fixture
def eight_gb(monkeypatch):
    """A machine of 8 GB physical memory: the limit is 4 GB."""
    monkeypatch.setattr(limits, "physical_memory", lambda: GB8)


# ------------------------------------------------------------------ 1. memory and queue depths
def test_memory_limit_is_a_share_of_physical_memory():
    import os
    assert limits.memory_limit() == int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * limits.MEMORY_SHARE)


def test_a_decode_run_too_large_for_memory_is_refused_before_allocating(eight_gb, capsys):
    tr = load_trace("stdlib:asyncio/base_events.py", limit=200)
    L, C = tr.layers, tr.columns
    want = (f"2000000 steps x 64 sessions x {L * C} row slots a step (~24 bytes a slot) needs about "
            f"{2000000 * 64 * L * C * 24 / 1e9:.3g} GB of memory, more than the limit of 4 GB (0.5 of this "
            "machine's 8 GB physical memory, sim.core.limits.MEMORY_SHARE): make the run smaller")
    with pytest.raises(ArgumentError) as e:
        simulate_decode(tr, "seed-apple-m3-ultra", run=DecodeRun(sessions=64, steps=2000000), compute=0.01)
    assert str(e.value) == want
    assert cli(capsys, ["sim", "decode", "--limit", "200", "--steps", "2000000", "--sessions", "64",
                        "--compute-ms", "10"]) == f"engram sim decode: error: {want}"


def test_a_serving_run_with_too_many_requests_is_refused(eight_gb, capsys):
    want = ("rate 1e+09 requests/s x duration 5 s = 5e+09 requests (~1024 bytes a request) needs about "
            "5.12e+03 GB of memory, more than the limit of 4 GB (0.5 of this machine's 8 GB physical memory, "
            "sim.core.limits.MEMORY_SHARE): make the run smaller")
    with pytest.raises(ArgumentError) as e:
        make_requests(Workload(1e9, 5.0), 0)
    assert str(e.value) == want
    assert cli(capsys, ["sim", "serve", "--duration-s", "5", "--trace-limit", "20000", "--rate", "1e9"]) == \
        f"engram sim serve: error: {want}"


@pytest.mark.parametrize("qd", ["99999999999", "0", "1.5", "x"])
def test_device_table_queue_depths_are_bounded(tmp_path, capsys, qd):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"kind": "empirical", "name": "d", "table": {"1": {"mean_us": 80}, qd: {"mean_us": 90}}}))
    why = (f"queue depth {int(qd)} is outside [1, 65536] (sim.core.limits.MAX_QUEUE_DEPTH: an NVMe queue's largest size)"
           if qd.isdigit() else f"queue depth {qd!r} is not a whole number")
    with pytest.raises(FormatError) as e:
        load_device(path)
    assert str(e.value) == f"{path}: empirical device: table: {why}"
    assert cli(capsys, ["sim", "device", str(path)]) == f"engram sim device: error: {path}: empirical device: table: {why}"


# ------------------------------------------------------------------ 2. seeds
def test_negative_seeds_are_refused(capsys):
    with pytest.raises(ArgumentError, match=r"^seed must be >= 0, got -1$"):
        simulate_decode("stdlib:asyncio/base_events.py", "seed-apple-m3-ultra", run=DecodeRun(steps=5, seed=-1),
                        compute=0.01)
    with pytest.raises(ArgumentError, match=r"^seed must be >= 0, got -1$"):
        make_requests(Workload(1.0, 5.0), -1)
    for args in (["sim", "decode", "--limit", "50", "--steps", "5", "--compute-ms", "10", "--seed", "-1"],
                 ["sim", "serve", "--duration-s", "5", "--seed", "-1"]):
        assert cli(capsys, args) == f"engram sim {args[1]}: error: seed must be >= 0, got -1"


# ------------------------------------------------------------------ 3. ssd: device strings
RANGE = "is outside its physical range"


@pytest.mark.parametrize("extra, why", [
    ("parallelism=nan", f"ssd: parallelism = nan {RANGE} (0, 65536] (sim.device.datasheet.SPEC_MAX)"),
    ("qd_peak=nan", f"ssd: qd_peak = nan {RANGE} (0, 65536] (sim.device.datasheet.SPEC_MAX)"),
    ("parallelism=inf", f"ssd: parallelism = inf {RANGE} (0, 65536] (sim.device.datasheet.SPEC_MAX)"),
    ("qd_peak=inf", f"ssd: qd_peak = inf {RANGE} (0, 65536] (sim.device.datasheet.SPEC_MAX)"),
    # rates have a floor of one read a second (sim.device.models.MIN_IOPS): 1e-30 is a typo, not a drive
    ("iops_row=1e300", f"ssd: iops_row = 1e+300 {RANGE} [1, 1e+09] (sim.device.datasheet.SPEC_MAX, "
                       "sim.device.models.MIN_IOPS)"),
    ("iops_row=1e-30", f"ssd: iops_row = 1e-30 {RANGE} [1, 1e+09] (sim.device.datasheet.SPEC_MAX, "
                       "sim.device.models.MIN_IOPS)"),
    ("cv=-1", f"ssd: cv = -1 {RANGE} [0, 10] (sim.device.datasheet.SPEC_MAX)"),
    ("qd_peak=2.5", "ssd: qd_peak = 2.5 must be a whole number"),
    ("qd1_us=5", "key 'qd1_us' given twice"),
])
def test_ssd_spec_fields_are_checked(capsys, extra, why):
    spec = f"ssd:qd1_us=80,iops=1000,{extra}"
    with pytest.raises(ArgumentError) as e:
        load_device(spec)
    assert str(e.value) == f"device spec {spec!r}: {why}"
    assert cli(capsys, ["sim", "device", spec]) == f"engram sim device: error: device spec {spec!r}: {why}"


@pytest.mark.parametrize("spec, why", [
    ("ssd:qd1_us=80,iops=1e30", f"ssd: iops = 1e+30 {RANGE} [1, 1e+09] (sim.device.datasheet.SPEC_MAX, "
                                "sim.device.models.MIN_IOPS)"),
    ("ssd:qd1_us=1e300,iops=1000", f"ssd: qd1_us = 1e+300 {RANGE} (0, 1e+06] (sim.device.datasheet.SPEC_MAX)"),
    ("ssd:qd1_us=900000,iops=1e9", "ssd: row IOPS x QD1 latency = 9e+08 reads in flight to reach the ceiling, "
                                   "more than the deepest queue (65536, sim.core.limits.MAX_QUEUE_DEPTH)"),
])
def test_ssd_spec_figures_are_bounded_to_physical_ranges(spec, why):
    with pytest.raises(ArgumentError) as e:
        load_device(spec)
    assert str(e.value) == f"device spec {spec!r}: {why}"


# ------------------------------------------------------------------ 4. fio JSON output
FIO = __import__("pathlib").Path(__file__).parent / "data" / "fio-randread-4k-libaio.json"


def _set(doc, path, value):
    *head, last = path
    for k in head:
        doc = doc[k]
    doc[last] = value


@pytest.mark.parametrize("path, value, why", [
    (("jobs", 0, "read", "iops"), "abc", 'jobs[0].read.iops: expected a number, got "abc"'),
    (("jobs", 0, "read", "iops"), -5, "jobs[0].read.iops: expected a finite number >= 0, got -5"),
    (("jobs", 0, "read", "iops"), float("nan"), "jobs[0].read.iops: expected a finite number >= 0, got nan"),
    (("jobs", 0, "read", "lat_ns", "mean"), "x", "jobs[0].read: lat_ns.mean = 'x' is not a number"),
    (("jobs", 0, "read", "clat_ns", "min"), "x", "jobs[0].read: clat_ns.min = 'x' is not a number"),
    (("jobs", 0, "read", "clat_ns", "percentile", "99.000000"), "x",
     'jobs[0].read: clat_ns.percentile["99.000000"] = \'x\' is not a number'),
    (("jobs", 0, "read", "clat_ns", "percentile", "99.000000"), -3,
     'jobs[0].read: clat_ns.percentile["99.000000"] = -3 is not a latency (a finite number > 0)'),
    (("jobs", 0, "read", "clat_ns", "percentile", "p99"), 5,
     'jobs[0].read.clat_ns.percentile["p99"]: the key is not a percentile (a number in (0, 100))'),
    (("jobs", 0, "read", "clat_ns", "percentile"), [1, 2], "jobs[0].read.clat_ns.percentile: expected a JSON "
                                                            "object, got [1, 2]"),
    (("jobs", 0, "read"), [1], "jobs[0].read: expected a JSON object, got [1]"),
    (("jobs", 0, "read", "clat_ns"), "x", 'jobs[0].read.clat_ns: expected a JSON object, got "x"'),
    (("jobs", 0), "x", 'jobs[0]: expected a JSON object, got "x"'),
    (("global options",), [], '"global options": expected a JSON object, got []'),
    (("jobs", 0, "job options"), "x", 'jobs[0]["job options"]: expected a JSON object, got "x"'),
])
def test_fio_output_fields_are_typed_and_ranged(tmp_path, capsys, path, value, why):
    doc = json.loads(FIO.read_text())
    _set(doc, path, value)
    if path[-1] == "p99":
        doc["jobs"][0]["read"]["lat_ns"].pop("percentile", None)  # the clat percentiles are the ones read
    f = tmp_path / "fio.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as e:
        load_device(f)
    assert str(e.value) == f"{f}: {why}"
    assert cli(capsys, ["sim", "device", str(f)]) == f"engram sim device: error: {f}: {why}"


# ------------------------------------------------------------------ 5. saved devices, microbenchmarks, calibrations
PARAM = {"kind": "parametric_ssd", "name": "p", "qd1_latency_us": 80.0, "iops": 500000.0, "parallelism": 40,
         "service_cv": 0.5}


@pytest.mark.parametrize("doc, why", [
    (dict(PARAM, iops="x"), "parametric_ssd device: iops = 'x' is not a finite number"),
    (dict(PARAM, qd1_latency_us="x"), "parametric_ssd device: qd1_latency_us = 'x' is not a finite number"),
    (dict(PARAM, service_cv="x"), "parametric_ssd device: service_cv = 'x' is not a finite number"),
    (dict(PARAM, parallelism="x"), "parametric_ssd device: parallelism = 'x' is not a whole number"),
    (dict(PARAM, parallelism=float("nan")), "parametric_ssd device: parallelism = nan is not a whole number"),
    (dict(PARAM, parallelism=2.5), "parametric_ssd device: parallelism = 2.5 is not a whole number"),
    (dict(PARAM, iops=1e30), "parametric_ssd device: ParametricSSD: iops = 1e+30 is outside its physical range "
                             "[1, 1e+09] (sim.device.models.MAX_*)"),
    ({"kind": "empirical", "table": {"1": "x"}},
     "empirical device: table['1']: latency distribution: expected an object, got 'x'"),
    ({"kind": "empirical", "table": {"1": {"mean_us": "x"}}},
     "empirical device: table['1']: latency distribution: mean_us = 'x' is not a number"),
    ({"kind": "calibration", "schema": "engram.calibration/1", "devices": {"pread": "x"}},
     "devices.pread: device: expected a JSON object, got 'x'"),
    ({"kind": "calibration", "schema": "engram.calibration/1", "devices": "x"},
     "devices: expected a JSON object, got 'x'"),
])
def test_saved_device_fields_are_typed(tmp_path, capsys, doc, why):
    f = tmp_path / "d.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as e:
        load_device(f)
    assert str(e.value) == f"{f}: {why}"
    assert cli(capsys, ["sim", "device", str(f)]) == f"engram sim device: error: {f}: {why}"


@pytest.mark.parametrize("lines, why", [
    ([{"qd": "a", "iops": 1000}], "record 0: queue depth 'a' is not a whole number"),
    ([{"qd": 1.5, "iops": 1000}], "record 0: queue depth 1.5 is not a whole number"),
    ([{"qd": 1, "p50_us": "x"}], "record 0 (qd 1): latency distribution: p50_us = 'x' is not a number"),
    ([{"qd": 1, "samples_us": [1, "x"]}],
     "record 0 (qd 1): latency distribution: samples_us[1] = 'x' is not a number"),
    ([{"qd": 1, "iops": 1000}, {"qd": 1, "iops": 900}], "record 1: queue depth 1 given twice"),
    ([{"qd": 1, "iops": -5}], "record 0 (qd 1): iops = -5 must be a positive number"),
])
def test_microbenchmark_records_are_typed(tmp_path, capsys, lines, why):
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(FormatError) as e:
        load_device(f)
    why = why.replace("record 0", "line 1").replace("record 1", "line 2")
    assert str(e.value) == f"{f}: {why}"
    assert cli(capsys, ["sim", "device", str(f)]) == f"engram sim device: error: {f}: {why}"


# ------------------------------------------------------------------ 6. text files that are not UTF-8
def test_read_text_names_the_file_and_the_byte(tmp_path):
    from sim.core.io import read_text
    f = tmp_path / "x.toml"
    f.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(FormatError) as e:
        read_text(f, "study")
    assert str(e.value) == f"{f}: the study is not UTF-8 text: byte 11 is 0xe9 (invalid continuation byte)"
    with pytest.raises(FormatError) as e:
        read_text(tmp_path / "none.csv", "table")
    assert str(e.value) == f"{tmp_path / 'none.csv'}: cannot read table (No such file or directory)"


@pytest.mark.parametrize("name, body, args, what, at", [
    ("s.toml", b'[study]\nname = "\xff"\n', ["sim", "serve", "{f}"], "study", 16),
    ("s.toml", b'[study]\nname = "\xff"\n', ["sim", "capacity", "{f}"], "study", 16),
    ("s.toml", b'[study]\nname = "\xff"\n', ["sim", "sweep", "{f}"], "study", 16),
    ("r.jsonl", b'{"prompt": "\xe9"}\n', ["sim", "serve", "--requests", "{f}", "--prompt-tokens", "file", "--duration-s", "5"],
     "requests file", 12),
    ("m.jsonl", b'{"qd": 1, "iops": 5}\n\xff\n', ["sim", "device", "{f}"], "device file", 21),
    ("s.csv", b"threshold,tokens_per_s\n\xc3\n", ["report", "--sweep", "{f}", "--out", "{d}/r", "--quick", "--quiet"],
     "table", 23),
])
def test_files_that_are_not_utf8_are_refused(tmp_path, capsys, name, body, args, what, at):
    f = tmp_path / name
    f.write_bytes(body)
    line = cli(capsys, [a.format(f=f, d=tmp_path) for a in args])
    assert line.endswith(f": {f}: the {what} is not UTF-8 text: byte {at} is 0x{body[at]:02x} "
                         f"({'invalid start byte' if body[at] == 0xff else 'invalid continuation byte'})"), line


# ------------------------------------------------------------------ 7. trace files
@pytest.fixture(scope="module")
def trace100():
    return load_trace("stdlib:asyncio/base_events.py", limit=100)


def _trace_file(tmp_path, trace100, kind):
    if kind == "truncated.npz":
        b = trace100.save(tmp_path / "t.npz").read_bytes()
        (tmp_path / kind).write_bytes(b[: len(b) // 2])
    elif kind == "big.npz":
        rows = trace100.rows.copy()
        rows[:] = 2**31
        type(trace100)(rows, trace100.tokens, trace100.starts, trace100.layer_ids, trace100.heads,
                       trace100.source, trace100.names).save(tmp_path / kind)
    elif kind == "truncated.npy":
        np.save(tmp_path / "t.npy", np.arange(100, dtype=np.int64))
        (tmp_path / kind).write_bytes((tmp_path / "t.npy").read_bytes()[:160])
    elif kind == "object.npy":
        np.save(tmp_path / kind, np.array([1, "a", None], dtype=object), allow_pickle=True)
    elif kind == "2d.npy":
        np.save(tmp_path / kind, np.arange(100, dtype=np.int64).reshape(10, 10))
    return tmp_path / kind


@pytest.mark.parametrize("kind, why", [
    ("truncated.npz", "cannot read trace (BadZipFile: File is not a zip file)"),
    ("big.npz", "step 0, layer 1, column 0: row 2147483648 is beyond its table (384006168 rows)"),
    ("truncated.npy", "not a readable .npy array of token ids (Failed to read all data for array. Expected (100,) = "
                      "100 elements, could only read 4 elements. (file seems not fully written?))"),
    ("object.npy", "not a readable .npy array of token ids (Object arrays cannot be loaded when allow_pickle=False)"),
    ("2d.npy", "token array must be one-dimensional [tokens], got shape (10, 10)"),
])
def test_corrupt_trace_files_are_refused(tmp_path, capsys, trace100, kind, why):
    f = _trace_file(tmp_path, trace100, kind)
    with pytest.raises(FormatError) as e:
        load_trace(str(f))
    assert str(e.value) == f"{f}: {why}"
    assert cli(capsys, ["sim", "decode", "--trace", str(f), "--steps", "5", "--compute-ms", "10"]) == \
        f"engram sim decode: error: {f}: {why}"


def test_an_empty_trace_says_so(capsys):
    with pytest.raises(ArgumentError) as e:
        load_trace("text:")
    assert str(e.value) == "the trace 'text:' is empty: its source has no tokens"
    assert cli(capsys, ["sim", "decode", "--trace", "text:", "--steps", "50", "--compute-ms", "10"]) == \
        "engram sim decode: error: the trace 'text:' is empty: its source has no tokens"


# ------------------------------------------------------------------ 8. sweep tables given to the report
STUDY = '[study]\nname = "e"\n[fixed]\ntrace_limit = 100\nsteps = 50\ncompute_ms = 10.0\n[grid]\nthreshold = [8, 256]\n'


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    (d / "s.toml").write_text(STUDY)
    assert main(["sim", "sweep", str(d / "s.toml"), "--out", str(d / "t.csv"), "--quiet", "--jobs", "1"]) == 0
    return (d / "t.csv").read_text()


def test_a_sweep_refuses_to_overwrite_its_default_table(tmp_path, capsys, monkeypatch):
    """Without --out a sweep writes STUDY.csv (s.csv here) in the current directory: a second run there is refused in one line
    (the file, the --out that replaces it, the --resume that continues it), the earlier table byte for byte as it
    was; named with --out it is replaced."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(STUDY)
    argv = ["sim", "sweep", "s.toml", "--quiet", "--jobs", "1"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "s.csv" in before
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("s.csv exists (an earlier sweep): give --out s.csv to replace it, --resume to continue "
                        "it, or another --out"), err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert main([*argv, "--out", "s.csv"]) == 0


def _edit(text, how):
    lines = text.splitlines(keepends=True)
    head = lines[0].rstrip("\n").split(",")
    col = head.index("tokens_per_s")
    if how == "truncated":
        return "".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 3]
    if how == "header only":
        return lines[0]
    if how == "empty":
        return ""
    if how == "missing column":
        return "".join(",".join(c for j, c in enumerate(ln.rstrip("\n").split(",")) if j != col) + "\n"
                       for ln in lines)
    cells = lines[2].rstrip("\n").split(",")
    cells[col] = {"abc": "abc", "negative": "-5.0", "nan": "nan"}[how]
    return "".join(lines[:2]) + ",".join(cells) + "\n" + "".join(lines[3:])


@pytest.mark.parametrize("how, why", [
    ("truncated", "line 3: column 'tokens_per_s' is empty (the row is cut short)"),
    ("abc", "line 3: column 'tokens_per_s' = 'abc' is not a number"),
    ("negative", "line 3: column 'tokens_per_s' = -5 must be a finite number >= 0"),
    ("nan", "line 3: column 'tokens_per_s' = nan must be a finite number >= 0"),
    ("missing column", "line 1: no column 'tokens_per_s' (a result column of every sweep table)"),
    ("header only", "the table has no rows (empty, or a header only)"),
    ("empty", "the table has no rows (empty, or a header only)"),
])
def test_corrupt_sweep_tables_are_refused_by_the_report(tmp_path, capsys, sweep_csv, how, why):
    from sim.sweep import METRICS, read_table
    f = tmp_path / "t.csv"
    f.write_text(_edit(sweep_csv, how))
    if how == "truncated":  # a resumed run reads the finished rows and skips the one cut short
        assert len(read_table(f)[0]) == 2
    with pytest.raises(FormatError) as e:
        read_table(f, metrics=METRICS)
    assert str(e.value) == f"{f}: {why}"
    assert cli(capsys, ["report", "--sweep", str(f), "--out", str(tmp_path / "r"), "--quick", "--quiet"]) == \
        f"engram report: error: {f}: {why}"
    assert not (tmp_path / "r").exists()  # refused before the report folder is made


def test_a_crosscheck_that_is_a_folder_cannot_be_read(tmp_path, capsys):
    (tmp_path / "crosscheck.json").mkdir()
    line = cli(capsys, ["report", str(tmp_path), "--out", str(tmp_path / "r"), "--quick", "--quiet"])
    assert line == f"engram report: error: {tmp_path / 'crosscheck.json'}: cannot read (Is a directory)"


# ------------------------------------------------------------------ 9. output paths checked before a search
CAPACITY = '[study]\nname = "c"\n[capacity]\ntarget = 20.0\nseeds = 1\nmax_sessions = 4\n[fixed]\n' \
           'trace_limit = 100\nsteps = 50\ncompute = "reference"\n'
SERVE = '[study]\nname = "s"\n[serve]\ntrace_limit = 8192\nduration_s = 5\n[slo]\nttft_s = 1.0\n' \
        '[search]\nseeds = 1\nmin_rate = 2.0\nmax_rate = 4.0\n'


@pytest.mark.parametrize("body", [CAPACITY, SERVE])
@pytest.mark.parametrize("out", ["/dev/full", "folder"])
def test_capacity_output_is_checked_before_the_search(tmp_path, capsys, monkeypatch, body, out):
    import sim.sweep.capacity
    import sim.serve.search

    def ran(*a, **k):
        raise AssertionError("the search ran")
    monkeypatch.setattr(sim.sweep.capacity, "find_capacity", ran)
    monkeypatch.setattr(sim.serve.search, "find_serve_capacity", ran)
    study = tmp_path / "s.toml"
    study.write_text(body)
    target = tmp_path / "folder" if out == "folder" else __import__("pathlib").Path(out)
    if out == "folder":
        target.mkdir()
    line = cli(capsys, ["sim", "capacity", str(study), "--out", str(target), "--quiet"])
    assert line == f"engram sim capacity: error: {target}: cannot write a table over it (not a regular file)"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s.toml"] + (["folder"] if out == "folder" else []))


@pytest.mark.parametrize("field,value", [("sessions", 2.5), ("sessions", True), ("sessions", "two"), ("steps", 1.5),
                                         ("bins", 0.5)])
def test_decode_run_counts_are_whole_numbers(field, value):
    from sim.decode import DecodeRun

    with pytest.raises(ArgumentError, match=rf"^{field} must be a whole number >= 1, got {value!r}$"):
        DecodeRun(**{field: value})


def test_settings_of_the_wrong_kind_are_named():
    from sim.core.params import Policy
    from sim.decode import DecodeRun, simulate_decode
    from sim.serve import ServeRun, Workload, simulate_serve

    tr = "synth:reuse=0.2,tokens=200,seed=0"
    with pytest.raises(ArgumentError, match=r"^run must be a sim\.DecodeRun\(\.\.\.\), got int 8$"):
        simulate_decode(tr, "seed-apple-m3-ultra", Policy(), 0.0, 8)
    with pytest.raises(ArgumentError, match=r"^policy must be a sim\.Policy\(\.\.\.\), got str 'x'$"):
        simulate_decode(tr, "seed-apple-m3-ultra", "x")
    with pytest.raises(ArgumentError, match=r"^run must be a sim\.DecodeRun\(\.\.\.\), got ServeRun"):
        simulate_decode(tr, "seed-apple-m3-ultra", Policy(), 0.0, ServeRun())
    with pytest.raises(ArgumentError, match=r"^workload must be a sim\.Workload\(\.\.\.\), got str 'rate=3'$"):
        simulate_serve("rate=3")
    with pytest.raises(ArgumentError, match=r"^run must be a sim\.ServeRun\(\.\.\.\), got DecodeRun"):
        simulate_serve(Workload(rate=1.0, duration=5.0), run=DecodeRun())
    with pytest.raises(ArgumentError, match=r"^seed must be >= 0, got -1$"):
        ServeRun(seed=-1)
    with pytest.raises(ArgumentError, match=r"^ServeRun\.bins must be a whole number >= 1, got 2\.5$"):
        ServeRun(bins=2.5)


@pytest.mark.parametrize("make,match", [
    (lambda: __import__("sim").DecodeRun(hash_time=float("nan")), r"^hash_time must be a finite number >= 0 seconds"),
    (lambda: __import__("sim").DecodeRun(hash_time="x"), r"^hash_time must be a finite number >= 0 seconds"),
    (lambda: __import__("sim").DecodeRun(start_spread=float("inf")), r"^start_spread must be a finite number >= 0"),
    (lambda: __import__("sim").DecodeRun(sessions=10 ** 11), r"^sessions must be <= 1,000,000"),
    (lambda: __import__("sim").DecodeRun(bins=10 ** 9), r"^bins must be <= 100,000"),
    (lambda: __import__("sim").DecodeRun(progress="x"), r"^progress must be one of"),
    (lambda: __import__("sim").Storage(drives=float("inf")), r"^Storage\.drives must be a whole number >= 1"),
    (lambda: __import__("sim").Storage(drives=10 ** 6), r"^Storage\.drives must be <= 4,096"),
    (lambda: __import__("sim").Policy(batch_overhead=float("nan")), r"^Policy\.batch_overhead must be a finite"),
    (lambda: __import__("sim").PrefillRun(chunk=0), r"^chunk must be >= 1, got 0$"),
    (lambda: __import__("sim").PrefillRun(seed=-1), r"^seed must be >= 0"),
    (lambda: __import__("sim").PrefillRun(tokens="x"), r"^tokens must be a whole number >= 1"),
    (lambda: __import__("sim.serve", fromlist=["ServeRun"]).ServeRun(warmup="x"), r"^ServeRun\.warmup must be a finite"),
    (lambda: __import__("sim.serve", fromlist=["ServeRun"]).ServeRun(drain=float("nan")), r"^ServeRun\.drain must be"),
])
def test_settings_refuse_bad_numbers_naming_the_field(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()


@pytest.mark.parametrize("flags,match", [
    (["--batch-overhead-us", "nan"], "Policy.batch_overhead must be a finite number >= 0 seconds, got nan"),
    (["--sessions", "99999999999"], "sessions must be <= 1,000,000, got 99,999,999,999"),
    (["--bins", "1000000000"], "bins must be <= 100,000"),
    (["--drives", "1000000"], "drives must be <= 4,096"),
    (["--sessions", "2", "--start-spread-ms", "-1"], "--start-spread-ms must be a finite number >= 0 ms, got -1.0"),
])
def test_decode_flags_refuse_bad_numbers_in_one_line(flags, match, capsys):
    from engram.cli import main

    rc = main(["sim", "decode", "--trace", "synth:reuse=0.2,tokens=200", "--no-progress", "--steps", "3", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and match in err, err
