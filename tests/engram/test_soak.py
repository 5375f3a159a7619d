"""Soak (issue 9): 16 decode sessions in threads, each stepping through its own stretch of real
text, must give exactly the rows of a serial decode, with open descriptors and resident
memory flat.

Sessions churn on the way (every ``CHURN`` steps a session is snapshotted, closed, and a new
one restored from the snapshot), so opening and closing leak-check too.  The sessions read
through the shared engine of the device: while they run the process holds at most the engine's
readers (its pool) more threads than the 16 of the sessions themselves (issue 15).  Each step's rows
are reduced to a CRC-32 of their bytes; the serial references are

- the same sessions run one after the other in one thread, for the default run, and
- for both runs, the ground truth: the whole sequence hashed in one call
  (:meth:`engram.Hasher.hash`) and the synthetic table bytes at those rows decoded with
  :func:`engram.decode_rows`.

Default run: 16 sessions x 300 steps.  Marked heavy: 16 sessions x 10,000 steps on a larger
model (``-m heavy``).
"""

from __future__ import annotations

import threading
import time
import zlib

import numpy as np
import pytest

from engram import EngramModel, Hasher, decode_rows, synth
from engram.io_engine import ENGINE_READERS
from tests.faults import fd_count, rss_bytes, thread_count
from tests.modelfiles import token_map as _token_map

SESSIONS = 16
SEED = 11


def _sequences(tokenizer, shared_data, steps: int):
    """16 disjoint stretches of ``steps`` tokens of real text (the corpus repeats if too short)."""
    need = SESSIONS * steps
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[: need * 6]
    ids = np.array(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    if ids.shape[0] < need:
        ids = np.resize(ids, need)
    return [ids[i * steps:(i + 1) * steps] for i in range(SESSIONS)]


def _step_digest(rows: dict, layer_ids) -> int:
    c = 0
    for lid in layer_ids:
        c = zlib.crc32(np.ascontiguousarray(rows[lid]).view(np.uint8), c)
    return c


def _truth_digests(model: EngramModel, seq: np.ndarray, chunk: int = 1000) -> np.ndarray:
    """CRC-32 per step of the rows a fault-free serial decode gives (batch hash + decode)."""
    row_ids = Hasher(model.layout, model.token_map).hash(seq)  # [T, L, 24]
    out = np.empty(seq.shape[0], np.uint32)
    for lo in range(0, seq.shape[0], chunk):
        hi = min(seq.shape[0], lo + chunk)
        dec = []
        for li, lid in enumerate(model.layer_ids):
            ids = row_ids[lo:hi, li, :]
            dec.append(decode_rows(synth.rows_at(lid, ids.reshape(-1), seed=SEED)).reshape(hi - lo, -1))
        for t in range(hi - lo):
            c = 0
            for d in dec:
                c = zlib.crc32(d[t].view(np.uint8), c)
            out[lo + t] = c
    return out


def _run_session(model, seq, churn, digests, errors, progress, i, **opts):
    try:
        s = model.session(**opts)
        try:
            for t, tok in enumerate(seq):
                if churn and t and t % churn == 0:
                    snap = s.snapshot()
                    s.close()
                    s = model.session(**opts)
                    s.restore(snap)
                digests[t] = _step_digest(s.step(int(tok)), model.layer_ids)
                progress[i] = t + 1
        finally:
            s.close()
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        errors.append((i, exc))


def soak(model: EngramModel, seqs, churn: int, serial_check: bool):
    """Run the sessions in threads; returns a report dict after asserting equality and flatness."""
    steps = len(seqs[0])
    truth = [_truth_digests(model, s) for s in seqs]
    if serial_check:  # real sessions run one after the other in this thread
        for i, seq in enumerate(seqs):
            d = np.zeros(steps, np.uint32)
            errs: list = []
            _run_session(model, seq, 0, d, errs, [0] * len(seqs), i)
            assert not errs, errs
            assert np.array_equal(d, truth[i]), f"serial session {i} differs from the batch hash + decode"
    fds0, threads0 = fd_count(), thread_count()
    digests = [np.zeros(steps, np.uint32) for _ in seqs]
    progress = [0] * len(seqs)
    errors: list = []
    threads = [threading.Thread(target=_run_session, args=(model, seqs[i], churn, digests[i], errors, progress, i),
                                name=f"soak-{i}") for i in range(len(seqs))]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    samples = []  # (fraction done, fds, rss)
    peak_threads = 0
    while any(th.is_alive() for th in threads):
        samples.append((sum(progress) / (steps * len(seqs)), fd_count(), rss_bytes()))
        peak_threads = max(peak_threads, thread_count())
        time.sleep(0.05)
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    assert not errors, errors[:3]
    for i in range(len(seqs)):
        bad = np.flatnonzero(digests[i] != truth[i])
        assert bad.size == 0, f"session {i}: {bad.size} steps differ from serial, first at step {bad[0]}"
    # descriptors: all back once the sessions are closed, and bounded while they ran
    deadline = time.monotonic() + 5
    while fd_count() > fds0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fd_count() == fds0, f"descriptors {fds0} -> {fd_count()}"
    assert thread_count() == threads0
    engine_threads = peak_threads - threads0 - len(seqs)
    assert engine_threads <= ENGINE_READERS + 2, f"{engine_threads} threads beside the {len(seqs)} sessions'"
    per_session = max(f for _, f, _ in samples) - fds0 if samples else 0
    assert per_session <= len(seqs) * 8, f"{per_session} descriptors for {len(seqs)} sessions"
    # resident memory: flat between a fifth of the way and the end
    late = [r for frac, _, r in samples if frac >= 0.2]
    if len(late) >= 2:
        growth = max(late) - late[0]
        assert growth < max(0.05 * late[0], 48 << 20), f"RSS grew by {growth / 2**20:.1f} MiB during the soak"
    else:
        growth = 0
    return {"sessions": len(seqs), "steps": steps, "wall_s": wall, "steps_per_s": steps * len(seqs) / wall,
            "max_fds_during": max((f for _, f, _ in samples), default=fds0), "fds_before": fds0,
            "engine_threads": engine_threads,
            "rss_growth_mib": growth / 2**20}


def _model(tmp_path_factory, scale):
    path = tmp_path_factory.mktemp("soak") / "soak.gguf"
    synth.build_model(path, synth.ModelShape(scale=scale, token_map=_token_map(), seed=SEED),
                      synth.Fill(projections=False), progress=False)
    return EngramModel.open(path, readers=8)


def test_soak_16_sessions(tmp_path_factory, tokenizer, shared_data):
    model = _model(tmp_path_factory, 0.0001)
    rep = soak(model, _sequences(tokenizer, shared_data, 300), churn=100, serial_check=True)
    print(f"\nsoak: {rep}")


@pytest.mark.heavy
def test_soak_16_sessions_10k_steps(tmp_path_factory, tokenizer, shared_data):
    model = _model(tmp_path_factory, 0.001)
    rep = soak(model, _sequences(tokenizer, shared_data, 10_000), churn=2_000, serial_check=False)
    print(f"\nsoak (heavy): {rep}")
