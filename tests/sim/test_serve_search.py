"""sim.serve study, search and panels: the TOML format, the rate search, capacity tables, resume, Dask."""

from __future__ import annotations

import math

import numpy as np
import pytest

import sim.serve.runner as serve_runner
from engram import ArgumentError
from sim.serve import SLO, RateSearch, ServeStudy, find_serve_capacity, knee_cause, run_serve_capacity
from sim.serve.panels import PANELS, goodput_by_device, knee_breakdown, latency_vs_load
from sim.serve.search import CAPACITY_COLUMNS, PROBE_COLUMNS, _rate_search, knee_words, probes_path
from sim.sweep.capacity import CAPACITY_RULE, SearchRun
from sim.serve.study import SERVE_AXES, SERVE_METRICS, is_serve_study, serve_point_seed
from sim.sweep import read_table
from sim.trace import CODE_SOURCE

FAST = "ssd:qd1_us=80,iops=600000,parallelism=32"
SLOW = "ssd:qd1_us=200,iops=40000"
STUDY = f"""
[study]
name = "tiny"
seed = 3

[serve]
trace = "{CODE_SOURCE}"
trace_limit = 8192
duration_s = 20
prompt_tokens = "lognormal:mean=200,cv=1,min=16,max=2000"
output_tokens = "lognormal:mean=40,cv=1,min=2,max=200"
compute_scale = 20
max_running = 32

[grid]
device = ["{SLOW}", "{FAST}"]

[slo]
ttft_s = 1.0
tbt_ms = 60

[search]
seeds = 2
min_rate = 2.0
max_rate = 64.0
resolution = 0.1
"""


@pytest.fixture()
def study(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(STUDY)
    return p


def test_a_serving_study_reads_back(study):
    st = ServeStudy.load(study)
    assert is_serve_study(study)
    pts = st.points()
    assert len(pts) == 2 and st.axes() == ["device"]
    assert pts[0]["duration_s"] == 20.0 and pts[1]["device"] == FAST and pts[0]["readers"] == 16
    assert set(pts[0]) == set(SERVE_AXES)
    assert st.slo == SLO(1.0, 60.0, 99.0) and st.search == RateSearch(2, 2.0, 64.0, 0.1)
    assert len(st.fingerprint()) == 16 and st.fingerprint() == ServeStudy.load(study).fingerprint()


@pytest.mark.parametrize("patch, match", [
    ("[plot]\nx = 1\n", "unknown section 'plot'"),
    ("[serve]\nspeed = 3\n", "unknown axis 'speed'"),
    ("[slo]\np99 = 3\n", "unknown key 'p99'"),
    ("[search]\nseeds = 0\n", "seeds"),
    ("[serve]\nrate = -1.0\n", "rate"),
    ("[serve]\ngate = 'later'\n", "gate"),
    ("[serve]\nprompt_tokens = 'file'\n", "requests"),
    ("[serve]\nduration_s = 10\nwarmup_s = 10\n", "warmup_s"),
    ("[serve]\nreaders = 'many'\n", "readers"),
])
def test_bad_studies_name_what_to_fix(patch, match):
    with pytest.raises(ArgumentError, match=match):
        ServeStudy.loads(f"[study]\nname = 'x'\n{patch}")


def test_a_points_seed_does_not_depend_on_its_rate():
    p = {k: d for k, (_, d, _) in SERVE_AXES.items()}
    a = serve_point_seed(0, {**p, "rate": 1.0})
    assert a == serve_point_seed(0, {**p, "rate": 9.5})
    assert a != serve_point_seed(0, {**p, "repeat": 1}) and a != serve_point_seed(1, p)


def _drive(search: RateSearch, passes) -> tuple:
    g = _rate_search(search)
    probes = [next(g)]
    try:
        while True:
            probes.append(g.send(passes(probes[-1])))
    except StopIteration as stop:
        return stop.value, probes


def test_the_rate_search_gallops_then_bisects():
    (cap, bound, below), probes = _drive(RateSearch(1, 0.5, 64.0, 0.02), lambda r: r <= 7.3)
    assert probes[:6] == [0.5, 1.0, 2.0, 4.0, 8.0, 6.0]
    assert not bound and not below and 7.3 * 0.98 <= cap <= 7.3
    (cap, bound, _), probes = _drive(RateSearch(1, 0.5, 64.0, 0.02), lambda r: True)
    assert bound and cap == 64.0 and probes[-1] == 64.0
    (cap, _, below), probes = _drive(RateSearch(1, 0.5, 64.0, 0.02), lambda r: r <= 0.1)
    assert probes[:4] == [0.5, 0.25, 0.125, 0.0625] and 0.098 <= cap <= 0.1 and not below
    (cap, _, below), _ = _drive(RateSearch(1, 0.5, 64.0, 0.02), lambda r: False)
    assert cap == 0.0 and below


def test_knee_cause_names_the_part_that_grew():
    base = {"tbt_at_slo_ms": 20, "ttft_at_slo_ms": 300, "tail_token_compute_ms": 5, "tail_token_reads_alone_ms": 3,
            "tail_token_contention_ms": 0.5, "tail_token_stall_ms": 0, "tail_ttft_queue_ms": 1,
            "tail_ttft_prefill_reads_ms": 100, "tail_ttft_prefill_compute_ms": 50}
    slo = SLO(2.0, 100.0)
    assert knee_cause(base, {**base, "tbt_at_slo_ms": 150, "tail_token_stall_ms": 40}, slo) == \
        ("tbt", "prefill reads starving decode")
    assert knee_cause(base, {**base, "tbt_at_slo_ms": 150, "tail_token_compute_ms": 60}, slo) == ("tbt", "compute")
    assert knee_cause(base, {**base, "tbt_at_slo_ms": 150, "tail_token_reads_alone_ms": 30}, slo) == \
        ("tbt", "device")
    assert knee_cause(base, {**base, "ttft_at_slo_ms": 5000, "tail_ttft_queue_ms": 3000}, slo) == \
        ("ttft", "queueing")
    assert knee_cause(base, {**base, "ttft_at_slo_ms": 5000, "tail_ttft_prefill_reads_ms": 900}, slo) == \
        ("ttft", "prefill reads")
    assert knee_cause(base, dict(base), slo)[0] == "unstable"


def test_a_configuration_failing_at_every_rate_reads_below_the_lowest():
    """Every halving of min_rate failed: the capacity reads '< lowest rate probed', and the cause is the
    largest part at that rate (nothing grew: it is the only failing rate)."""
    from sim.serve.search import MAX_HALVINGS, ServeCapacity
    fail = {"tbt_at_slo_ms": 20, "ttft_at_slo_ms": 5000, "tail_token_compute_ms": 5, "tail_token_reads_alone_ms": 3,
            "tail_token_contention_ms": 0.5, "tail_token_stall_ms": 0, "tail_ttft_queue_ms": 1,
            "tail_ttft_prefill_reads_ms": 4000, "tail_ttft_prefill_compute_ms": 50, "slo_met": 0, "repeat": 0,
            "requests_measured": 60}
    search = RateSearch(1, 0.5, 64.0, 0.05)
    cap = ServeCapacity(0, {}, search, SLO(2.0, 100.0), per_seed=[0.0], bound=[False], below=[True])
    cap.probes = [{**fail, "rate": 0.5 / 2 ** k} for k in range(MAX_HALVINGS + 1)]
    lowest = 0.5 / 2 ** MAX_HALVINGS
    assert cap.label().startswith(f"< {lowest:.3g} requests/s")
    assert cap.knee() == (lowest, "ttft", "prefill reads")


def test_capacity_tables_resume_and_panels(study, tmp_path, monkeypatch):
    out = tmp_path / "cap.csv"
    res = run_serve_capacity(study, jobs=1, out=out, progress=False)
    slow, fast = res.capacities
    assert fast.capacity > slow.capacity > 0 and len(slow.per_seed) == 2
    rows, meta = read_table(out)
    probes, pmeta = read_table(probes_path(out))
    assert meta["kind"] == "serve-capacity" and meta["complete"] and list(rows[0]) == CAPACITY_COLUMNS
    assert list(probes[0]) == PROBE_COLUMNS and len(probes) == len(res.probes()) == sum(len(c.probes) for c in
                                                                                       res.capacities)
    assert rows[1]["capacity_rps"] == fast.capacity and rows[1]["capacities"] == " ".join(
        f"{c:.6g}" for c in fast.per_seed)
    for c, r in zip(res.capacities, rows):
        k = c.median_seed()
        at = c.at(c.capacity, k)
        assert at["slo_met"] == 1 and r["tbt_p99_at_capacity_ms"] == at["tbt_p99_ms"]
        above = [p for p in c.probes if p["repeat"] == k and p["rate"] > c.capacity]
        assert above and all(p["slo_met"] == 0 for p in above if p["rate"] <= r["knee_rate"])
        assert r["knee_cause"] in ("compute", "device", "prefill reads starving decode", "queueing",
                                   "prefill reads", "prefill compute")
    # resume: every probe is taken from the table, nothing simulated again
    monkeypatch.setattr(serve_runner, "run_serve_point", lambda *a, **k: pytest.fail("simulated on resume"))
    again = run_serve_capacity(study, jobs=1, out=out, progress=False, resume=True)
    assert again.resumed == len(probes) and [c.per_seed for c in again.capacities] == [c.per_seed for c in
                                                                                      res.capacities]
    # panels
    g = goodput_by_device(rows)
    assert [x["capacity_rps"] for x in g] == [slow.capacity, fast.capacity] and g[1]["label"] == FAST
    lv = latency_vs_load(probes)
    assert {(x["config"], x["rate"]) for x in lv} == {(p["config"], p["rate"]) for p in probes}
    one = next(x for x in lv if x["config"] == 0 and x["rate"] == 2.0)
    mine = [p for p in probes if p["config"] == 0 and p["rate"] == 2.0]
    assert one["seeds"] == len(mine) and one["tbt_p99_ms"] == pytest.approx(np.mean([p["tbt_p99_ms"] for p in mine]))
    kb = knee_breakdown(probes)
    assert all(x["token_compute_ms"] > 0 for x in kb)
    assert [p[0] for p in PANELS] == ["serve_goodput", "serve_tbt_vs_load", "serve_ttft_vs_load", "serve_knee",
                                      "serve_counterpart"]


def test_panels_draw_on_an_axes(study, tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = tmp_path / "cap.csv"
    run_serve_capacity(study, jobs=1, out=out, progress=False, seeds=1)
    rows, _ = read_table(out)
    probes, _ = read_table(probes_path(out))
    fig, axs = plt.subplots(1, 4, figsize=(16, 4))
    for ax, (name, _, data, plot, kind) in zip(axs, PANELS[:4]):
        tab = data(rows if kind == "capacity" else probes)
        plot(ax, tab, 0) if name == "serve_knee" else plot(ax, tab)
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    fig.savefig(tmp_path / "p.png")
    plt.close(fig)


def test_more_slack_never_lowers_the_capacity(study):
    st = ServeStudy.load(study)
    cfgs = st.points()
    tight, _ = find_serve_capacity(cfgs, st.slo, RateSearch(1, 2.0, 64.0, 0.1), st.seed,
                                   run=SearchRun(jobs=1, progress=False))
    loose, _ = find_serve_capacity(cfgs, st.slo.scaled(2.0), RateSearch(1, 2.0, 64.0, 0.1), st.seed,
                                   run=SearchRun(jobs=1, progress=False))
    for a, b in zip(tight, loose):
        assert b.capacity >= a.capacity
    assert sum(b.capacity for b in loose) > sum(a.capacity for a in tight)


def test_the_search_on_a_dask_cluster_is_the_local_one(study):
    distributed = pytest.importorskip("dask.distributed")
    st = ServeStudy.load(study)
    cfgs = st.points()[1:]
    search = RateSearch(2, 4.0, 64.0, 0.1)
    local, _ = find_serve_capacity(cfgs, st.slo, search, st.seed, run=SearchRun(jobs=1, progress=False))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        remote, runner = find_serve_capacity(cfgs, st.slo, search, st.seed,
                                             run=SearchRun(scheduler=c.scheduler_address, progress=False))
    assert runner.startswith("dask:") and remote[0].per_seed == local[0].per_seed
    key = lambda p: (p["rate"], p["repeat"], p["seed"], p["ttft_p99_ms"], p["tbt_p99_ms"], p["goodput_rps"])  # noqa
    assert [key(p) for p in remote[0].probes] == [key(p) for p in local[0].probes]
    assert all(m in remote[0].probes[0] for m in SERVE_METRICS) and not math.isnan(remote[0].capacity)


def test_the_report_section_of_a_serving_capacity_table(study, tmp_path):
    pytest.importorskip("matplotlib")
    from sim.report import Doc, ReportFolder
    from sim.report.sections import sweeps_section

    out = tmp_path / "cap.csv"
    res = run_serve_capacity(study, jobs=1, out=out, progress=False, seeds=1)
    doc, folder = Doc("t"), ReportFolder(tmp_path / "rep")
    assert sweeps_section(doc, folder, [out]) == []  # requests/s are not session capacities
    md = doc.markdown()
    assert "# Serving capacity study: tiny" in md and "p99 TTFT <= 1 s, p99 TBT <= 60 ms" in md
    assert f"The capacity is {CAPACITY_RULE}" in md and "median over the seeds" not in md.replace("lower median", "")
    for c in res.capacities:
        line = next(x for x in md.splitlines() if x.startswith(f"| {c.config['device']} |"))
        assert f"| {c.capacity:.3g} |" in line and knee_words(*c.knee()) in line
    names = [f"serving_tiny_{k}" for k in ("goodput", "latency", "knee")]
    assert [f[0] for f in folder.figures] == [f"figures/{n}.png" for n in names]
    assert all((folder.root / "figures" / f"{n}.png").stat().st_size > 0 for n in names)
    data, _ = read_table(folder.root / "data" / "serving_tiny_goodput.csv")
    assert [r["capacity_rps"] for r in data] == [c.capacity for c in res.capacities]
    load, _ = read_table(folder.root / "data" / "serving_tiny_latency.csv")
    assert len(load) == len({(p["config"], p["rate"]) for p in res.probes()})
    assert {p.name for p in (folder.root / "inputs").iterdir()} >= {"cap.csv", "cap.csv.probes.csv"}


def test_the_capacity_of_an_even_count_of_seeds_is_the_lower_median():
    """Per-seed 9 and 12 give 9, as CAPACITY_RULE (every output's wording) says."""
    from sim.sweep.capacity import Capacity, CapacitySpec
    from sim.serve.search import ServeCapacity
    assert Capacity(0, {}, CapacitySpec(), per_seed=[9, 12], bound=[False, False]).capacity == 9
    assert ServeCapacity(0, {}, RateSearch(), SLO(), per_seed=[12.0, 9.0]).capacity == 9.0
    assert ServeCapacity(0, {}, RateSearch(), SLO(), per_seed=[12.0, 9.0, 10.0]).capacity == 10.0
    assert "lower median" in CAPACITY_RULE and "conservative" in CAPACITY_RULE


def test_knee_words():
    assert knee_words(3.25, "ttft", "queueing") == "TTFT over the target at 3.25 requests/s, from queueing"
    assert knee_words(1.0, "tbt+ttft", "compute").startswith("TBT and TTFT over the target")
    assert knee_words(0.688, "unstable", "prefill reads") == \
        "requests left unfinished (the queue grows) at 0.688 requests/s, from prefill reads"
    assert knee_words(None, "", "") == ""


def test_a_probe_measures_at_least_min_requests(study, tmp_path):
    """At rates whose 20 s window would hold one request, each probe's window is lengthened to expect
    min_requests plus three standard deviations; the capacity row names the fewest requests measured."""
    text = study.read_text().replace("min_rate = 2.0", "min_rate = 0.05\nmin_requests = 20").replace(
        "max_rate = 64.0", "max_rate = 0.2").replace(f'device = ["{SLOW}", "{FAST}"]', f'device = ["{FAST}"]')
    p = tmp_path / "low.toml"
    p.write_text(text)
    st = ServeStudy.load(p)
    assert st.search.min_requests == 20
    res = run_serve_capacity(p, jobs=1, out=tmp_path / "low.csv", progress=False)
    cap = res.capacities[0]
    want = 20 + 3 * math.sqrt(20)
    for pr in cap.probes:
        assert pr["duration_s"] == pytest.approx(max(20.0, want / pr["rate"]))
        assert pr["requests_measured"] >= 20
    assert cap.fewest_requests == min(pr["requests_measured"] for pr in cap.probes) >= 20
    rows, meta = read_table(tmp_path / "low.csv")
    assert meta["capacity_rule"] == CAPACITY_RULE
    assert rows[0]["min_requests"] == 20 and rows[0]["fewest_requests"] == cap.fewest_requests
    assert rows[0]["small_sample"] in (0, False) and "SMALL SAMPLE" not in cap.label()
    # a probe below the minimum is flagged, in the row and in the label
    cap.search = RateSearch(seeds=2, min_rate=0.05, max_rate=0.2, resolution=0.1, min_requests=10_000)
    assert cap.small_sample and cap.row()["small_sample"] and "SMALL SAMPLE" in cap.label()
    # the point's own window when it is long enough; constant arrivals need no margin
    rs = RateSearch(min_requests=50)
    assert rs.probe_duration({"duration_s": 300.0, "warmup_s": 0.0, "arrivals": "poisson"}, 4.0) == 300.0
    assert rs.probe_duration({"duration_s": 10.0, "warmup_s": 5.0, "arrivals": "constant"}, 0.5) == 105.0
    with pytest.raises(ArgumentError, match="min_requests"):
        RateSearch(min_requests=0)


def test_an_unknown_search_override_is_refused_naming_it(study, monkeypatch):
    monkeypatch.setattr(serve_runner, "run_serve_point", lambda *a, **k: pytest.fail("simulated"))
    with pytest.raises(ArgumentError) as exc:
        run_serve_capacity(study, jobs=1, progress=False, seed=1)
    msg = str(exc.value)
    assert "tiny.toml: [search] and the overrides: RateSearch has no field 'seed'" in msg, msg
    assert "seeds, min_rate, max_rate, resolution, min_requests" in msg, msg
    assert not isinstance(exc.value, TypeError)
