"""Hand-edited or corrupt measurement documents, one test per kind: runs.json's runs, calibration.json's windows,
microbench.json's probe records and the measurement's settings are refused before any work with an
engram.EngramError naming the file, the run / window / record, the field and the value, and on the command line
as one line, exit 2, no traceback.  Valid documents (older calibrations too) keep working as they did."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from engram import synth
from engram.errors import ArgumentError, FormatError
import sim.check.crosscheck
import sim.check.windows
from sim.check.calibrate import Calibration, calibrate, calibrate_file
from sim.check.crosscheck import crosscheck, crosscheck_files
from sim.device import load_device
from sim.core.io import load_json
from sim.measure import Settings, measure
from sim.core.schema import RunConfig
from sim.trace import CODE_SOURCE
from sim.check.windows import FIT_MAX_STEPS, WINDOW_MIN_STEPS
from tests.clirun import cli
from tests.modelfiles import SCALE, token_map as _token_map

NAN, INF = float("nan"), float("inf")


def _set(doc, path, value):
    """Set ``doc[path...]`` to ``value``; ``DEL`` removes the key."""
    *head, last = path
    for k in head:
        doc = doc[k]
    if value is DEL:
        del doc[last]
    else:
        doc[last] = value


DEL = object()
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A real measurement of one single-session and one two-session configuration, calibrated."""
    d = tmp_path_factory.mktemp("docs")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=9),
                      synth.Fill(projections=False), progress=False)
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 30),
            RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 30, 2, "threads")]
    measure(path, cfgs, d, rounds=1, depths=(1, 4), fio=False, io_batches=8, io_chunks=1, big_seconds=0.01,
            single_rows=8, compute_samples=8, warmup=2, probe_every=3, shared_seconds=0.02, cache_batches=4,
            capacity_target=100.0, progress=False)
    calibrate_file(d / "microbench.json", d / "calibration.json")
    return d


@pytest.fixture
def no_work(monkeypatch):
    """Any trace loading or simulation of the cross-check or the calibration's window fit fails the test."""
    def ran(*a, **k):
        raise AssertionError("work began before the input was checked")
    monkeypatch.setattr(sim.check.crosscheck, "_load_traces", ran)
    monkeypatch.setattr(sim.check.crosscheck, "predict_run", ran)
    monkeypatch.setattr(sim.check.windows, "window_state", ran)


# ------------------------------------------------------------------ 1. runs.json
def _run_index(doc, multi: bool) -> int:
    keys = {c["key"]: c["sessions"] > 1 for c in doc["configs"]}
    return next(i for i, r in enumerate(doc["runs"]) if keys[r["config"]] == multi)


@pytest.mark.parametrize("multi, path, value, why", [
    (False, ("tokens_per_s",), NAN, "tokens_per_s = nan must be a finite number > 0"),
    (False, ("tokens_per_s",), 0, "tokens_per_s = 0 must be a finite number > 0"),
    (False, ("tokens_per_s",), "fast", "tokens_per_s = 'fast' is not a number"),
    (False, ("tokens_per_s",), DEL, "missing field 'tokens_per_s'"),
    (False, ("step_ms", "p50"), -1, "step_ms.p50 = -1 must be a finite number >= 0"),
    (False, ("step_ms", "p95"), DEL, "step_ms: missing field 'p95'"),
    (False, ("step_ms",), DEL, "missing field 'step_ms'"),
    (False, ("read_ms",), "x", "read_ms: expected a JSON object, got 'x'"),
    (False, ("read_ms", "mean"), INF, "read_ms.mean = inf must be a finite number >= 0"),
    (False, ("compute_ms", "mean"), DEL, "compute_ms: missing field 'mean'"),
    (False, ("compute_ms", "p95"), "x", "compute_ms.p95 = 'x' is not a number"),
    (True, ("slowest_tokens_per_s",), 0, "slowest_tokens_per_s = 0 must be a finite number > 0"),
    (True, ("aggregate_tokens_per_s",), NAN, "aggregate_tokens_per_s = nan must be a finite number > 0"),
    (False, ("background",), "busy", "background: expected a JSON object, got 'busy'"),
    (False, ("background", "cpu"), 1.5, "background.cpu = 1.5 must be a finite number >= 0 and <= 1"),
    (False, ("background", "steal"), NAN, "background.steal = nan must be a finite number >= 0 and <= 1"),
    (False, ("background", "cpu"), "x", "background.cpu = 'x' is not a number"),
    (False, ("window",), 3, "window = 3 is not a string"),
    (False, ("probe_every",), -1, "probe_every = -1 must be >= 0"),
    (False, ("probe_every",), 2.5, "probe_every = 2.5 is not a whole number"),
    (False, ("start",), "0", "start = '0' is not a whole number"),
    (False, ("start",), True, "start = True is not a whole number"),
    (True, ("starts", 1), -5, "starts[1] = -5 must be >= 0"),
    (True, ("starts",), 7, "starts: expected a list, got 7"),
    (True, ("start_offsets_s", 0), NAN, "start_offsets_s[0] = nan must be a finite number >= 0"),
    (False, ("step_us", 2), -3.0, "step_us[2] = -3 is not a latency (a finite number > 0)"),
])
def test_bad_runs_are_refused_naming_the_run_and_key(measured, tmp_path, capsys, no_work, multi, path, value, why):
    doc = load_json(measured / "runs.json")
    i = _run_index(doc, multi)
    run = doc["runs"][i]
    _set(run, path, value)
    f = tmp_path / "runs.json"
    f.write_text(json.dumps(doc))
    want = f"{f}: runs[{i}] (configuration {run['config']!r}, round {run['round']}): {why}"
    cal = Calibration.load(measured / "calibration.json")
    with pytest.raises(FormatError) as e:
        crosscheck(cal, doc, runs_path=f)
    assert str(e.value) == want
    with pytest.raises(FormatError) as e:
        crosscheck_files(measured / "calibration.json", f)
    assert str(e.value) == want
    assert cli(capsys, ["crosscheck", str(tmp_path), "--calibration", str(measured / "calibration.json"),
                        "--runs", str(f), "--no-progress"]).endswith(f": {want}")
    assert not (tmp_path / "crosscheck.json").exists()


@pytest.mark.parametrize("edit, why", [
    (lambda d: d.update(runs={"a": 1}), "runs: expected a list, got {'a': 1}"),
    (lambda d: d["runs"].__setitem__(0, "x"), "runs[0]: expected a JSON object, got 'x'"),
    (lambda d: d["runs"][0].__setitem__("config", 5), "runs[0]: config = 5 is not a string"),
    (lambda d: d["params"].__setitem__("capacity_target", -1), "params: capacity_target = -1 must be a finite "
                                                               "number > 0"),
    (lambda d: d["params"].__setitem__("capacity_target", NAN), "params: capacity_target = nan must be a finite "
                                                                "number > 0"),
    (lambda d: d.update(params=[1]), "document: params: expected a JSON object, got [1]"),
    (lambda d: d.update(traces=["t.npz"]), "document: traces: expected a JSON object, got ['t.npz']"),
    (lambda d: d.update(configs="x"), "configs: expected a list, got 'x'"),
    (lambda d: d["configs"][0].__setitem__("steps", "x"),
     "configs[0] ({key}): run configuration: steps = 'x' is not a whole number"),
    (lambda d: d["configs"][0].__setitem__("threshold", 8.5),
     "configs[0] ({key}): run configuration: threshold = 8.5 is not a whole number"),
    (lambda d: d["configs"][0].__setitem__("readers", 0),
     "configs[0] ({key}): run configuration: readers = 0 must be >= 1"),
    (lambda d: d["configs"][0].__setitem__("backend", "aio"),
     "configs[0] ({key}): run configuration: backend must be 'pread' or 'io_uring', got 'aio'"),
])
def test_bad_runs_documents_are_refused(measured, tmp_path, no_work, edit, why):
    doc = load_json(measured / "runs.json")
    key = doc["configs"][0]["key"]
    edit(doc)
    cal = Calibration.load(measured / "calibration.json")
    with pytest.raises(FormatError) as e:
        crosscheck(cal, doc, runs_path=tmp_path / "runs.json")
    assert str(e.value) == f"{tmp_path / 'runs.json'}: {why.replace('{key}', key)}"
    with pytest.raises(FormatError) as e:  # no file known: no file named
        crosscheck(cal, doc)
    assert str(e.value) == why.replace('{key}', key)


@pytest.mark.parametrize("doc", [None, [1, 2], "runs.json", 5])
def test_crosscheck_of_something_not_a_document_is_an_argument_error(measured, doc):
    cal = Calibration.load(measured / "calibration.json")
    with pytest.raises(ArgumentError, match=r"^crosscheck needs a decode-run document \(a mapping\), got "):
        crosscheck(cal, doc)
    with pytest.raises(ArgumentError, match=r"^crosscheck needs a Calibration, got dict$"):
        crosscheck(cal.to_dict(), load_json(measured / "runs.json"))


@pytest.mark.parametrize("field, value, why", [
    ("steps", "x", "steps = 'x' is not a whole number"),
    ("steps", 2.5, "steps = 2.5 is not a whole number"),
    ("steps", 0, "steps = 0 must be >= 1"),
    ("sessions", None, "sessions = None is not a whole number"),
    ("threshold", True, "threshold = True is not a whole number"),
    ("trace", 5, "trace = 5 is not a string"),
    ("mode", "fibers", "mode must be one of ('threads', 'processes'), got 'fibers'"),
    ("compute", "warp:1", "compute spec 'warp:1': unknown part 'warp:1' (use none, mixer, spin:MS, sleep:MS, "
                          "blas:N)"),
])
def test_run_config_fields_are_typed(field, value, why):
    d = RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 30).to_dict()
    d[field] = value
    with pytest.raises(FormatError) as e:
        RunConfig.from_dict(d)
    assert str(e.value) == f"run configuration: {why}"


# ------------------------------------------------------------------ 2. calibration.json windows
@pytest.mark.parametrize("key, value, why", [
    ("device", NAN, "device = nan is not a latency (a finite number > 0)"),
    ("device", 0, "device = 0 is not a latency (a finite number > 0)"),
    ("device", "x", "device = 'x' is not a number"),
    ("device", DEL, "missing field 'device'"),
    ("compute", 0, "compute = 0 is not a latency (a finite number > 0)"),
    ("compute", INF, "compute = inf is not a latency (a finite number > 0)"),
    ("read_se", -1, "read_se = -1 must be a finite number >= 0"),
    ("compute_se", "x", "compute_se = 'x' is not a number"),
    ("step_cv", NAN, "step_cv = nan must be a finite number >= 0"),
    ("threshold", 0, "threshold = 0 must be >= 1"),
    ("readers", 2.5, "readers = 2.5 is not a whole number"),
    ("sessions", True, "sessions = True is not a whole number"),
    ("probe_steps", DEL, "missing field 'probe_steps'"),
    ("batch_samples_us", [1.0, NAN], "batch_samples_us[1] = nan is not a latency (a finite number > 0)"),
    ("batch_samples_us", [1.0, -2.0], "batch_samples_us[1] = -2 is not a latency (a finite number > 0)"),
    ("compute_samples_us", "x", "compute_samples_us: expected a list, got 'x'"),
    ("compute_samples_us", [1, "2"], "compute_samples_us[1] = '2' is not a number"),
    ("backend", 5, "backend = 5 is not a string"),
])
def test_bad_calibration_windows_are_refused_naming_the_window_and_key(measured, tmp_path, capsys, key, value,
                                                                       why):
    doc = load_json(measured / "calibration.json")
    wid = sorted(doc["windows"])[0]
    _set(doc["windows"][wid], (key,), value)
    f = tmp_path / "calibration.json"
    f.write_text(json.dumps(doc))
    want = f"{f}: calibration: window {wid!r}: {why}"
    with pytest.raises(FormatError) as e:
        Calibration.load(f)
    assert str(e.value) == want
    assert cli(capsys, ["crosscheck", str(tmp_path), "--calibration", str(f), "--runs", str(measured / "runs.json"),
                        "--no-progress"]).endswith(f": {want}")


@pytest.mark.parametrize("windows, why", [
    ([], "calibration: windows: expected a JSON object, got []"),
    ({"r0-c0": "x"}, "calibration: window 'r0-c0': state: expected a JSON object, got 'x'"),
])
def test_calibration_windows_must_be_objects(measured, windows, why):
    doc = load_json(measured / "calibration.json")
    doc["windows"] = windows
    with pytest.raises(FormatError) as e:
        Calibration.from_dict(doc)
    assert str(e.value) == why


def test_older_calibrations_and_empty_samples_still_load(measured):
    doc = load_json(measured / "calibration.json")
    assert doc["windows"] and any(w["batch_samples_us"] for w in doc["windows"].values())
    old = copy.deepcopy(doc)
    for w in old["windows"].values():  # calibrations written before the windows' own shapes
        del w["batch_samples_us"], w["compute_samples_us"]
    cal = Calibration.from_dict(old)
    assert cal.windows == old["windows"]
    empty = copy.deepcopy(doc)
    for w in empty["windows"].values():
        w["batch_samples_us"], w["compute_samples_us"] = [], []
    assert Calibration.from_dict(empty).windows == empty["windows"]
    assert Calibration.from_dict(doc).windows == doc["windows"]
    none = copy.deepcopy(doc)
    del none["windows"]
    assert Calibration.from_dict(none).windows == {}


# ------------------------------------------------------------------ 3. microbench.json probe records
def _probe_index(doc, multi: bool) -> int:
    return next(i for i, r in enumerate(doc["records"])
                if r.get("tool") == "session" and (r.get("sessions", 1) > 1) == multi)


@pytest.mark.parametrize("multi, key, value, why", [
    (False, "batch_us", [], "batch_us is empty (one read time a probe step)"),
    (False, "batch_us", "x", "batch_us: expected a list, got 'x'"),
    (False, "batch_us", DEL, "missing field 'batch_us'"),
    (False, "batch_us", lambda n: [100.0] * (n - 1) + [0.0], "batch_us[{last}] = 0 is not a latency (a finite number > 0)"),
    (False, "batch_us", lambda n: [NAN] + [100.0] * (n - 1), "batch_us[0] = nan is not a latency (a finite number > 0)"),
    (False, "batch_us", lambda n: [100.0, "x"] + [100.0] * (n - 2), "batch_us[1] = 'x' is not a number"),
    (False, "compute_us", lambda n: [0.0] * (n - 1), "compute_us has {short} values, batch_us has {n}"),
    (False, "compute_us", lambda n: [-1.0] + [0.0] * (n - 1), "compute_us[0] = -1 must be a finite number >= 0"),
    (False, "t_us", lambda n: [0.0] * (n - 1) + [INF], "t_us[{last}] = inf must be a finite number"),
    (False, "t_us", lambda n: [0.0] * (n + 1), "t_us has {long} values, batch_us has {n}"),
    (False, "distinct", lambda n: [48] * (n - 1) + [0], "distinct[{last}] = 0 must be >= 1"),
    (False, "distinct", lambda n: [48.5] + [48] * (n - 1), "distinct[0] = 48.5 is not a whole number"),
    (True, "sessions", 0, "sessions = 0 must be >= 1"),
    (False, "threshold", "8", "threshold = '8' is not a whole number"),
    (False, "readers", DEL, "missing field 'readers'"),
    (True, "session_steps", -1, "session_steps = -1 must be >= 1"),
    (True, "session_steps", 1.5, "session_steps = 1.5 is not a whole number"),
    (True, "offsets_s", [0.0, -0.5], "offsets_s[1] = -0.5 must be a finite number >= 0"),
    (True, "offsets_s", [0.0], "offsets_s has 1 values, sessions has 2"),
    (False, "backend", None, "backend = None is not a string"),
    (False, "compute", "warp:1", "compute: compute spec 'warp:1': unknown part 'warp:1' (use none, mixer, "
                                 "spin:MS, sleep:MS, blas:N)"),
])
def test_bad_probe_records_are_refused_naming_the_window_and_key(measured, tmp_path, capsys, no_work, multi, key,
                                                                 value, why):
    doc = load_json(measured / "microbench.json")
    i = _probe_index(doc, multi)
    rec = doc["records"][i]
    n = len(rec["batch_us"])
    _set(rec, (key,), value(n) if callable(value) else value)
    f = tmp_path / "microbench.json"
    f.write_text(json.dumps(doc))
    want = (f"{f}: record {i} (probe steps of window {rec['probe']!r}): "
            + why.format(n=n, last=n - 1, short=n - 1, long=n + 1))
    with pytest.raises(FormatError) as e:
        calibrate_file(f)
    assert str(e.value) == want
    assert cli(capsys, ["calibrate", str(tmp_path), "--microbench", str(f)]).endswith(f": {want}")
    assert not (tmp_path / "calibration.json").exists()


def test_a_window_probed_twice_is_refused(measured, tmp_path, no_work):
    doc = load_json(measured / "microbench.json")
    i = _probe_index(doc, False)
    doc["records"].append(copy.deepcopy(doc["records"][i]))
    j = len(doc["records"]) - 1
    f = tmp_path / "microbench.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as e:
        calibrate_file(f)
    assert str(e.value) == (f"{f}: record {j}: window {doc['records'][i]['probe']!r} is probed twice (records {i} "
                            f"and {j}): one probe record a decode run")
    doc["records"][j]["probe"] = 5
    with pytest.raises(FormatError) as e:
        calibrate(doc)
    assert str(e.value) == f"record {j}: probe = 5 is not a window id (a non-empty string)"


# ------------------------------------------------------------------ 4. window fits: too few steps, bounded loops
def test_a_window_of_too_few_probe_steps_is_not_fitted(measured):
    doc = load_json(measured / "microbench.json")
    i = _probe_index(doc, False)
    rec = doc["records"][i]
    full = calibrate(load_json(measured / "microbench.json"))
    assert full.window(rec["probe"]) is not None
    for key in ("batch_us", "compute_us", "t_us", "distinct", "session"):
        rec[key] = rec[key][: WINDOW_MIN_STEPS - 1]
    cal = calibrate(doc)
    assert cal.window(rec["probe"]) is None
    assert set(cal.windows) == set(full.windows) - {rec["probe"]}
    # its run is predicted with the calibrated device and compute, as a run without probes
    dev, comp = cal.window_models(rec["backend"], rec["compute"], rec["probe"])
    assert dev is cal.device(rec["backend"], rec["compute"]) and comp is cal.compute_model(rec["compute"])
    rec["batch_us"] = rec["batch_us"] + [rec["batch_us"][0]]  # WINDOW_MIN_STEPS steps are fitted
    for key in ("compute_us", "t_us", "distinct"):
        rec[key] = rec[key] + [rec[key][0]]
    assert calibrate(doc).window(rec["probe"])["probe_steps"] == WINDOW_MIN_STEPS


def test_the_several_session_fit_simulates_a_bounded_loop(measured, monkeypatch):
    doc = load_json(measured / "microbench.json")
    i = _probe_index(doc, True)
    doc["records"][i]["session_steps"] = 1_000_000
    steps = []
    real = sim.check.windows.simulate_decode

    def spy(*a, **k):
        steps.append((a[4] if len(a) > 4 else k["run"]).steps)
        return real(*a, **k)
    monkeypatch.setattr(sim.check.windows, "simulate_decode", spy)
    cal = calibrate(doc)
    assert steps and max(steps) == FIT_MAX_STEPS
    assert cal.window(doc["records"][i]["probe"])["fit_simulations"] >= 1


# ------------------------------------------------------------------ 5. measurement settings
@pytest.mark.parametrize("value", [1.5, NAN, "2", True, None, -1, 2.0])
def test_probe_every_must_be_a_whole_number(value):
    with pytest.raises(ArgumentError) as e:
        Settings(probe_every=value)
    assert str(e.value) == f"probe_every must be a whole number >= 0, got {value!r}"


@pytest.mark.parametrize("steps", [0, -3, 1.5, "30", True, None, NAN])
def test_run_probe_every_needs_whole_steps(steps):
    with pytest.raises(ArgumentError) as e:
        Settings().run_probe_every(steps)
    assert str(e.value) == f"steps must be a whole number >= 1, got {steps!r}"


def test_measure_checks_its_settings_before_building_the_model(tmp_path, capsys):
    work = tmp_path / "w"
    line = cli(capsys, ["measure", str(work), "--quick", "--probe-every", "-1", "--no-progress"])
    assert line.endswith(": probe_every must be a whole number >= 0, got -1")
    assert not work.exists() or not any(work.iterdir())  # no model file written
    line = cli(capsys, ["measure", str(work), "--quick", "--depths", "0", "--no-progress"])
    assert line.endswith("depths must be integers >= 1, got [0]")
    assert not work.exists() or not any(work.iterdir())


# ------------------------------------------------------------------ zero is not a latency, in any document
def _zero_latencies(doc, value):
    """Every latency of a device document (``q_us`` of each distribution, its ``mean_us``) set to ``value``."""
    for dist in doc["table"].values():
        dist["q_us"] = [value] * len(dist["q_us"])
        dist["mean_us"] = value
    for b in doc.get("batches", []):
        b["dist"]["q_us"] = [value] * len(b["dist"]["q_us"])
    return doc


def _latency_document(kind, measured, tmp_path, value) -> tuple:
    """A document of ``kind`` whose latencies are ``value``: (path, the ``engram sim device`` arguments)."""
    if kind == "device-json":
        src = tmp_path / "preset.json"
        load_device("vm-virtio-16core-4k").save(src)
        doc = _zero_latencies(load_json(src), value)
    elif kind == "measured-batch-json":
        cal = load_json(measured / "calibration.json")
        doc = _zero_latencies(next(iter(cal["devices"].values())), value)
        doc["table"] = {q: d for q, d in list(doc["table"].items())}
    elif kind == "microbench-jsonl":
        f = tmp_path / "device.jsonl"
        rows = [{"qd": q, "iops": 1000 * q, "p50_us": value, "p99_us": 100.0} for q in (1, 2, 4)]
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return f, ["sim", "device", str(f)]
    elif kind == "fio-json":
        doc = load_json(DATA / "fio-randread-4k-libaio.json")
        for job in doc["jobs"]:
            for lat in ("lat_ns", "clat_ns"):
                if "mean" in job["read"].get(lat, {}):
                    job["read"][lat]["mean"] = value
    elif kind.startswith("calibration"):
        doc = load_json(measured / "calibration.json")
        if kind == "calibration-device":
            for d in doc["devices"].values():
                _zero_latencies(d, value)
        else:
            wid = sorted(doc["windows"])[0]
            doc["windows"][wid]["device" if kind == "calibration-window" else "batch_samples_us"] = \
                value if kind == "calibration-window" else [value]
        f = tmp_path / "calibration.json"
        f.write_text(json.dumps(doc))
        if kind == "calibration-device":
            return f, ["sim", "device", "calibrated", "--calibration", str(f)]
        return f, ["crosscheck", str(measured), "--calibration", str(f), "--runs", str(measured / "runs.json"),
                   "--no-progress"]  # the windows are read where a calibration is loaded whole
    f = tmp_path / f"{kind}.json"
    f.write_text(json.dumps(doc))
    return f, ["sim", "device", str(f)]


@pytest.mark.parametrize("value", [0, 0.0, -1.0, NAN])
@pytest.mark.parametrize("kind", ["device-json", "measured-batch-json", "microbench-jsonl", "fio-json",
                                  "calibration-device", "calibration-window", "calibration-window-samples"])
def test_zero_is_not_a_latency_in_any_document(measured, tmp_path, capsys, kind, value):
    """A device or calibration document whose latencies are zero, negative or NaN is refused when read (one
    line naming the file and the field, exit 2), never divided by later (sim.core.schema.LATENCY)."""
    f, args = _latency_document(kind, measured, tmp_path, value)
    err = cli(capsys, args)
    assert "is not a latency (a finite number > 0)" in err and str(f) in err, err


@pytest.mark.parametrize("command", ["calibrate", "crosscheck"])
def test_calibrate_and_crosscheck_refuse_a_missing_output_folder(measured, tmp_path, capsys, command):
    """tests/sim/test_output_paths.py walks the other file outputs; these two read a measurement folder."""
    out = tmp_path / "missing" / "out.json"
    err = cli(capsys, [command, str(measured), "--out", str(out), *(["--no-progress"] if command == "crosscheck"
                                                                    else [])])
    assert f"the folder {tmp_path / 'missing'} does not exist" in err and not (tmp_path / "missing").exists()
