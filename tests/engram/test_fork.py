"""fork() while a session's prefill reader is inside a read (engram.forks; issue 24).

Each case is a real ``os.fork()`` of a process whose prefill reader holds its
table's lock at that moment (the fork waits until it does).  The child does
one thing with one kind of object, writes what it saw to a pipe and exits
normally (``sys.exit``: finalizers and ``__del__`` of whatever it left open
run).  The parent waits for it with a deadline and kills it past that, so a
regression fails as "hung" instead of hanging the suite.  Every kind either
works in the child (rows equal to the synthetic content's) or raises a typed
:class:`engram.EngramError`, and every child exits.
"""

from __future__ import annotations

import pytest

from engram import synth
from tests.faults import backend_params, run_child, usable
from tests.modelfiles import token_map as _token_map

SEED = 7
PROMPT = 512
CHUNK = 64

SCRIPT = r'''
import json, os, signal, sys, time
import numpy as np
from engram import EngramError, EngramModel, Hasher, PrefetchCancelled, Table, TableGroup, TableIOError, decode_rows, synth
from engram.io_engine import generation, shared_engine

SEED, CHUNK = int(os.environ["SEED"]), int(os.environ["CHUNK"])
BACKEND, ENGINE = os.environ["BACKEND"], os.environ["ENGINE"]
model = EngramModel.open(os.environ["M_PATH"])
L = model.layer_ids
ids = np.array(json.loads(os.environ["IDS"]))
T = len(ids)
row_ids = Hasher(model.layout, model.token_map).hash(ids)
ref = {lid: decode_rows(synth.rows_at(lid, row_ids[:, li, :].reshape(-1), seed=SEED)).reshape(T, 24, 256)
       for li, lid in enumerate(L)}
DEADLINE = float(os.environ.get("DEADLINE", "30"))


def session():
    return model.session(backend=BACKEND, engine=ENGINE, readers=8)


def exact_steps(s, lo, hi):
    s.restore(model.hasher.new_history())
    for t in range(0, lo):
        s.step(int(ids[t]))
    return all(all(np.array_equal(r[lid], ref[lid][t]) for lid in L)
               for t, r in ((t, s.step(int(ids[t]))) for t in range(lo, hi)))


def in_flight():
    """A session whose prefill reader is inside a read of its first table (holding its lock)."""
    s = session()
    p = s.prefill(ids, chunk_tokens=CHUNK)
    t = s.tables[L[0]]
    end = time.monotonic() + 20
    while not t._lock.locked() and time.monotonic() < end:
        time.sleep(0.0005)
    return s, p, t._lock.locked() and p.progress[L[0]] < T


def fork(child):
    """Fork; the child runs child() and exits normally. Returns what it wrote, its exit status or 'hung'."""
    s, p, busy = in_flight()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = child(s, p)
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os.close(w)
        sys.exit(0)
    os.close(w)
    end = time.monotonic() + DEADLINE
    status = None
    while time.monotonic() < end:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.set_blocking(r, False)
    try:
        data = os.read(r, 1 << 20)
    except BlockingIOError:
        data = b""
    os.close(r)
    # the parent's prefill and steps go on, exact
    parent = all(np.array_equal(p.rows(lid, timeout=DEADLINE), ref[lid]) for lid in L) and exact_steps(s, 0, 30)
    s.close()
    return {"busy_at_fork": busy, "exit": "hung" if status is None else os.waitstatus_to_exitcode(status),
            "child": json.loads(data or b"{}"), "parent_exact": bool(parent)}


def prefetcher(s, p):
    exact = all(np.array_equal(p.rows(lid, timeout=DEADLINE), ref[lid]) for lid in L)
    part = np.array_equal(p.rows(L[1], 10, 40, timeout=DEADLINE), ref[L[1]][10:40])
    return {"exact": bool(exact and part), "progress": list(p.progress.values()), "done": p.done,
            "generation": generation()}


def prefetcher_cancel(s, p):
    p.cancel()
    try:
        p.wait(L[1], timeout=DEADLINE)
        return {"raised": None, "done": p.done}
    except EngramError as exc:
        return {"raised": type(exc).__name__, "done": p.done}


def session_close(s, p):
    s.close()
    try:
        s.step(int(ids[0]))
        return {"closed": s.closed, "raised": None}
    except EngramError as exc:
        return {"closed": s.closed, "raised": type(exc).__name__}


def session_steps(s, p):
    exact = exact_steps(s, 0, 40)
    s.restore(model.hasher.new_history())
    again = s.prefill(ids[:300])
    return {"exact": exact, "prefill_again": bool(all(
        np.array_equal(again.rows(lid, timeout=DEADLINE), ref[lid][:300]) for lid in L))}


def steps_then_exit(s, p):
    return {"exact": exact_steps(s, 0, 10)}  # left open: closed by __del__ at exit


def table(s, p):
    t = s.tables[L[0]]  # the table whose lock the parent's reader held
    got = t.read_batch(row_ids[:200, 0, :])
    rows = t.read_rows(row_ids[:5, 0, 0])
    t.close()
    try:
        t.read_rows(row_ids[:1, 0, 0])
        raised = None
    except EngramError as exc:
        raised = type(exc).__name__
    return {"exact": bool(np.array_equal(got, ref[L[0]][:200]) and np.array_equal(rows, ref[L[0]][:5, 0])),
            "closed_raises": raised}


def group(s, p):
    with TableGroup([s.tables[lid] for lid in L], 24) as g:
        got = g.read_batch(row_ids[:200].reshape(200, 48))
    want = np.concatenate([ref[lid][:200] for lid in L], axis=1)
    return {"exact": bool(np.array_equal(got, want))}


def engine(s, p):
    loc = model.info.tables[L[0]]
    e = shared_engine(loc.path)
    client = s.tables[L[0]].engine_client  # the parent's client (None with private readers)
    out = {}
    with Table(loc.path, loc.offset, loc.rows, backend=BACKEND, readers=8, engine="shared") as t:
        out["shared_exact"] = bool(np.array_equal(t.read_batch(row_ids[:100, 0, :]), ref[L[0]][:100]))
        out["engine_running"] = e.running and e.stats().issued > 0
    if client is not None:
        with Table(loc.path, loc.offset, loc.rows, backend=BACKEND, readers=8, engine=client) as t:
            out["parent_client_exact"] = bool(np.array_equal(t.read_batch(row_ids[:100, 0, :]), ref[L[0]][:100]))
    return out


def new_session(s, p):
    with session() as s2:
        pf = s2.prefill(ids)
        exact = all(np.array_equal(pf.rows(lid, timeout=DEADLINE), ref[lid]) for lid in L)
        return {"exact": bool(exact and exact_steps(s2, 0, 20))}


res = {}
for name in os.environ["KINDS"].split(","):
    res[name] = fork(globals()[name])
print(json.dumps(res))
'''

KINDS = ["prefetcher", "prefetcher_cancel", "session_close", "session_steps", "steps_then_exit", "table", "group",
         "engine", "new_session"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fork-model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=0.0001, token_map=_token_map(), seed=SEED),
                      synth.Fill(projections=False), progress=False)
    return path


@pytest.fixture(scope="module")
def prompt_ids(tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[20000:60000]
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:PROMPT]
    assert len(ids) == PROMPT
    return ids


_RUNS: dict = {}


def _params():
    """(engine, backend): the shared engine on the ring (else the pool) and private pools by default;
    the other two pairs are heavy."""
    out = []
    ring = "io_uring" if "io_uring" in usable(["io_uring"]) else "pread"
    for engine, default in (("shared", ring), ("private", "pread")):
        for p in backend_params(["pread", "io_uring"]):
            marks = list(p.marks) + ([] if p.id == default else [pytest.mark.heavy])
            out.append(pytest.param((engine,) + p.values, id=f"{engine}-{p.id}", marks=marks))
    return out


@pytest.fixture(params=_params())
def forked(request, model_path, prompt_ids):
    """What each kind's child saw, for one engine and backend (one process, a fork per kind)."""
    engine, backend = request.param
    key = (engine, backend)
    if key not in _RUNS:
        _RUNS[key] = run_child(SCRIPT, timeout=600, env={
            "M_PATH": str(model_path), "IDS": str(list(prompt_ids)), "BACKEND": backend, "ENGINE": engine,
            "SEED": str(SEED), "CHUNK": str(CHUNK), "KINDS": ",".join(KINDS)})
    return _RUNS[key]


def _case(forked, kind):
    r = forked[kind]
    assert r["busy_at_fork"], "the prefill reader was not inside a read at the fork"
    assert r["exit"] == 0, f"{kind}: the child {'never exited' if r['exit'] == 'hung' else 'failed'}: {r}"
    assert "error" not in r["child"], r["child"]
    assert r["parent_exact"], "the parent's prefill or steps went wrong after the fork"
    return r["child"]


def test_fork_prefetcher_in_flight_resumes_in_child(forked):
    """The prefill reader's thread is the parent's: the child's rows() resumes it and gets every row."""
    c = _case(forked, "prefetcher")
    assert c["exact"] and c["progress"] == [PROMPT, PROMPT] and c["done"] and c["generation"] == 1


def test_fork_prefetcher_cancel_in_child_raises_typed(forked):
    c = _case(forked, "prefetcher_cancel")
    assert c["raised"] == "PrefetchCancelled" and c["done"]


def test_fork_session_close_in_child_returns(forked):
    c = _case(forked, "session_close")
    assert c["closed"] and c["raised"] == "TableIOError"


def test_fork_session_steps_and_prefills_in_child(forked):
    c = _case(forked, "session_steps")
    assert c["exact"] and c["prefill_again"]


def test_fork_child_that_only_steps_exits(forked):
    """The child steps and exits with the session open: Table.close from __del__ must not wait."""
    assert _case(forked, "steps_then_exit")["exact"]


def test_fork_table_whose_lock_was_held_reads_in_child(forked):
    c = _case(forked, "table")
    assert c["exact"] and c["closed_raises"] == "TableIOError"


def test_fork_table_group_reads_in_child(forked):
    assert _case(forked, "group")["exact"]


def test_fork_io_engine_and_parent_client_in_child(forked):
    c = _case(forked, "engine")
    assert c["shared_exact"] and c["engine_running"]
    if "parent_client_exact" in c:
        assert c["parent_client_exact"]


def test_fork_new_session_in_child(forked):
    assert _case(forked, "new_session")["exact"]
