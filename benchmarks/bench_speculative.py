"""Speculative decoding in the engine (issue 27): drafts' rows read before they are needed, and the
verification step's batched read, on this machine's disk (``O_DIRECT``), side by side in one run.

The model is a real synthetic model file (``engram.synth``, ``--scale``, default 0.005: two tables of
1.9 M rows, built once under benchmarks/results/; no projection weights: only rows are read).  Tokens are
the DeepSeek V4 tokenizer's ids of the shipped novel (``promessi_sposi.txt``), hashed with the model's
layout.  Every round runs both sides of a part on fresh stretches of the text (rows of n-grams not read
before by that side), the order alternating round by round; medians over rounds.

Part (a), layer 1's read on the critical path.  Between steps a fixed compute stand-in (``--compute-ms``,
``time.sleep``, 5 ms) runs; the critical path of a step is the time from the end of that compute until
the step's rows are in (Engram's first layer is decoder layer 1, and a session's step reads both tables
as one batch, so this is layer 1's wait).

- Not speculative: ``step(t)`` after each compute; every step reads its 48 rows.
- Speculative, ``k`` drafts (``--k``, 2) at acceptance ``a`` (``--acceptance``, 0.7): right after a step
  returns, the drafter proposes the next ``k`` tokens (each the true next token of the text with
  probability ``a``, else a random id of the vocabulary) and ``prefetch(drafts)`` starts reading their
  rows; the compute runs and ends with the next token known.  When it is the first draft, the step
  verifies the drafts, ``step_many(drafts)``, taking their rows from the prefetch (waiting while its
  read is in flight), accepts them up to the first wrong one and rolls the rest back (``rollback``):
  it advances by the accepted drafts (the rollback comes after the rows are in, as verification's outcome
  comes after the forward pass: it is not on the critical path of the read).  When it is not, ``step(token)`` drops the prefetch and reads the
  token's rows on the critical path: it advances by one.

Reported: the mean critical-path read time a step, speculative over not (target <= 0.35), the same a
token generated, the share of steps whose first draft was right, and, because a shared machine's stalls
of tens of milliseconds dominate means, the share from the p50s: (share of steps with the first draft
right x their p50 + the others' share x their p50) / the plain steps' p50.

Part (b), the verification step's batch: ``step_many`` of ``k + 1`` = 3 tokens (up to 3 x 48 rows, one
sorted, deduplicated batch through the shared I/O engine) against ``step`` of one token (48 rows), each
on fresh text, the kinds of call interleaved call by call; ratio of the p50s (target <= 1.5) and of the
means.  A session's ``readers`` bound the reads in flight of one batch, so the pairs are measured with
sessions at ``--readers`` (16, the default) and at ``48 (k + 1)`` (every row of the batch in flight at
once: the higher queue depth a verification step reads at), at 48 and at ``48 (k + 1)``, and each kind at
the readers that minimise it.  Beside it, fio on the same file: IOPS at depths 16 to 144 (the time of
``n`` reads at the best depth ``d <= n`` is ``n / IOPS(d)``), and reads in bursts as a step makes them
(``n`` submitted together, all waited for): the device's own floor of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

import numpy as np

from .bench_table import fio_randread
from .common import RESULTS, real_text


def _model(scale: float, readers: int):
    from engram import EngramModel
    from engram.synth import Fill, ModelShape, build_model

    path = RESULTS / f"speculative-model-s{scale:g}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"   building {path} (scale {scale}) ...")
        build_model(path, ModelShape(scale=scale), Fill(projections=False), progress=False)
    return EngramModel.open(path, direct=True, readers=readers)


class Text:
    """The text's token ids, handed out in fresh stretches."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids
        self.pos = 0

    def take(self, n: int) -> np.ndarray:
        if self.pos + n > len(self.ids):
            self.pos = 0
        out = self.ids[self.pos:self.pos + n]
        self.pos += n
        return out


def plain_block(s, toks: np.ndarray, steps: int, compute_s: float) -> dict:
    """``steps`` plain decode steps on ``toks``: the critical-path time of each (one read)."""
    s.restore(s.model.hasher.new_history())
    s.step_many(toks[:3])
    crit = []
    for t in toks[3:3 + steps]:
        time.sleep(compute_s)
        t0 = time.perf_counter()
        s.step(int(t))
        crit.append(time.perf_counter() - t0)
    return {"crit_s": crit, "tokens": steps, "steps": steps}


def speculative_block(s, toks: np.ndarray, steps: int, compute_s: float, k: int, acceptance: float,
                      rng: np.random.Generator) -> dict:
    """``steps`` speculative steps on ``toks`` (see the module's docstring)."""
    vocab = s.model.hasher.vocab_size
    s.restore(s.model.hasher.new_history())
    s.step_many(toks[:3])
    p = 3
    crit, first_right, tokens, hits, waits, right_s, wrong_s = [], 0, 0, 0, [], [], []
    call_s, begun_s, ready_s = [], [], []
    for _ in range(steps):
        truth = toks[p:p + k]
        right = rng.random(k) < acceptance
        drafts = np.where(right, truth, rng.integers(0, vocab, k))
        drafts[~right & (drafts == truth)] = (truth[~right & (drafts == truth)] + 1) % vocab
        c0 = time.perf_counter()
        pf = s.prefetch(drafts)                       # right after the step returned
        call_s.append(time.perf_counter() - c0)
        time.sleep(compute_s)                         # the step's compute; it ends with the next token known
        t0 = time.perf_counter()
        if right[0]:                                  # the next token is the first draft: verify the drafts
            s.step_many(drafts)
            crit.append(time.perf_counter() - t0)     # the rows are in (the verification's rollback follows)
            m = int(np.argmin(right)) if not right.all() else k
            s.rollback(k - m)
            first_right += 1
            waits.append(max(0.0, (pf.ready_at or t0) - t0))
        else:                                         # it is not: the prefetch is dropped, the token read now
            s.step(int(truth[0]))
            crit.append(time.perf_counter() - t0)
            m = 1
        hits += s.last_stats.prefetch_hits
        if pf.begun_at is not None:
            begun_s.append(pf.begun_at - pf.issued_at)
        if pf.ready_at is not None:
            ready_s.append(pf.ready_at - pf.issued_at)
        (right_s if right[0] else wrong_s).append(crit[-1])
        p += m
        tokens += m
    return {"crit_s": crit, "tokens": tokens, "steps": steps, "first_right": first_right,
            "prefetch_hits": hits, "wait_s": waits, "right_s": right_s, "wrong_s": wrong_s,
            "call_s": call_s, "begun_s": begun_s, "ready_s": ready_s}


def part_a(model, text: Text, rounds: int, steps: int, compute_s: float, k: int, acceptance: float,
           seed: int) -> dict:
    rng = np.random.default_rng(seed)
    per = {"plain": [], "spec": []}
    with model.session() as plain, model.session() as spec:
        for r in range(rounds):
            order = ("plain", "spec") if r % 2 == 0 else ("spec", "plain")
            for side in order:
                toks = text.take(3 + steps * (k + 1) + k)
                if side == "plain":
                    per[side].append(plain_block(plain, toks, steps, compute_s))
                else:
                    per[side].append(speculative_block(spec, toks, steps, compute_s, k, acceptance, rng))
    rows = []
    for a, b in zip(per["plain"], per["spec"]):
        step_ratio = statistics.fmean(b["crit_s"]) / statistics.fmean(a["crit_s"])
        token_ratio = (sum(b["crit_s"]) / b["tokens"]) / (sum(a["crit_s"]) / a["tokens"])
        rows.append((step_ratio, token_ratio, b["first_right"] / b["steps"], b["tokens"] / b["steps"],
                     statistics.fmean(a["crit_s"]), statistics.fmean(b["crit_s"])))
    out = {
        "k": k, "acceptance": acceptance, "compute_ms": compute_s * 1e3, "steps_per_round": steps,
        "rounds": rounds,
        "plain_crit_ms_mean": statistics.median(x[4] for x in rows) * 1e3,
        "spec_crit_ms_mean": statistics.median(x[5] for x in rows) * 1e3,
        "share_per_step": statistics.median(x[0] for x in rows),
        "share_per_token": statistics.median(x[1] for x in rows),
        "share_per_step_rounds": [round(x[0], 3) for x in rows],
        "first_draft_right": statistics.median(x[2] for x in rows),
        "tokens_per_step": statistics.median(x[3] for x in rows),
        "plain_crit_ms_p50": statistics.median(t for a in per["plain"] for t in a["crit_s"]) * 1e3,
        "spec_crit_ms_p50": statistics.median(t for b in per["spec"] for t in b["crit_s"]) * 1e3,
        "spec_prefetch_not_ready_share": statistics.fmean(w > 0 for b in per["spec"] for w in b["wait_s"]),
        "spec_crit_ms_first_right_p50": statistics.median(t for b in per["spec"] for t in b["right_s"]) * 1e3,
        "spec_crit_ms_first_wrong_p50": statistics.median(t for b in per["spec"] for t in b["wrong_s"]) * 1e3,
        "spec_crit_ms_first_right_mean": statistics.fmean(t for b in per["spec"] for t in b["right_s"]) * 1e3,
        "spec_crit_ms_first_wrong_mean": statistics.fmean(t for b in per["spec"] for t in b["wrong_s"]) * 1e3,
        "share_per_step_p50_weighted": None,
        # where a prefetch's time goes: the prefetch() call (the caller's thread), from the call until its
        # reads were handed to the engine, and until its rows were decoded (p50s over all steps)
        "prefetch_call_ms_p50": statistics.median(t for b in per["spec"] for t in b["call_s"]) * 1e3,
        "prefetch_begun_ms_p50": statistics.median(t for b in per["spec"] for t in b["begun_s"]) * 1e3,
        "prefetch_ready_ms_p50": statistics.median(t for b in per["spec"] for t in b["ready_s"]) * 1e3,
        "prefetch_ready_ms_p90": float(np.percentile([t for b in per["spec"] for t in b["ready_s"]], 90)) * 1e3,
        "spec_prefetch_hits_per_step": statistics.fmean(b["prefetch_hits"] / b["steps"] for b in per["spec"]),
    }
    f = statistics.fmean(b["first_right"] / b["steps"] for b in per["spec"])
    out["share_per_step_p50_weighted"] = (f * out["spec_crit_ms_first_right_p50"] + (1 - f) *
                                          out["spec_crit_ms_first_wrong_p50"]) / out["plain_crit_ms_p50"]
    print(f"   (a) k={k}, acceptance {acceptance}, compute {compute_s * 1e3:g} ms: critical-path read a step "
          f"{out['plain_crit_ms_mean']:.3f} ms plain vs {out['spec_crit_ms_mean']:.3f} ms speculative: "
          f"share {out['share_per_step']:.3f} a step (rounds {out['share_per_step_rounds']}), "
          f"{out['share_per_token']:.3f} a token; first draft right {out['first_draft_right']:.2f}, "
          f"{out['tokens_per_step']:.2f} tokens a step; prefetch still in flight at the step: "
          f"{out['spec_prefetch_not_ready_share']:.2f}")
    print(f"       plain p50 {out['plain_crit_ms_p50']:.3f} ms; speculative, first draft right: p50 "
          f"{out['spec_crit_ms_first_right_p50']:.3f} / mean {out['spec_crit_ms_first_right_mean']:.3f} ms, "
          f"wrong: p50 {out['spec_crit_ms_first_wrong_p50']:.3f} / mean {out['spec_crit_ms_first_wrong_mean']:.3f} ms; "
          f"share from the p50s (weighted by the steps of each kind) {out['share_per_step_p50_weighted']:.3f}")
    print(f"       prefetch: the call {out['prefetch_call_ms_p50']:.3f} ms, reads handed to the engine after "
          f"{out['prefetch_begun_ms_p50']:.3f} ms, rows ready after {out['prefetch_ready_ms_p50']:.3f} ms p50 "
          f"(p90 {out['prefetch_ready_ms_p90']:.3f})")
    return out


def part_b(model, text: Text, rounds: int, calls: int, tokens: int, depths) -> dict:
    """``step`` of one token vs ``step_many`` of ``tokens``, sessions at each of ``depths`` readers (reads in
    flight a batch), all four kinds of call interleaved call by call, the order rotating."""
    kinds = [(d, n) for d in depths for n in (1, tokens)]
    times = {kd: [] for kd in kinds}
    dist = {kd: [] for kd in kinds}
    sessions = {kd: model.session(readers=kd[0]) for kd in kinds}
    try:
        for r in range(rounds):
            streams = {}
            for kd, s in sessions.items():
                streams[kd] = text.take(3 + calls * kd[1])
                s.restore(s.model.hasher.new_history())
                s.step_many(streams[kd][:3])
            per = {kd: [] for kd in kinds}
            for i in range(calls):
                j = (i + r) % len(kinds)
                for kd in kinds[j:] + kinds[:j]:
                    s, n = sessions[kd], kd[1]
                    toks = streams[kd][3 + i * n:3 + (i + 1) * n]
                    t0 = time.perf_counter()
                    if n == 1:
                        s.step(int(toks[0]))
                    else:
                        s.step_many(toks)
                    per[kd].append(time.perf_counter() - t0)
                    dist[kd].append(s.last_stats.rows_distinct)
            for kd in kinds:
                times[kd].append((statistics.median(per[kd]), statistics.fmean(per[kd])))
    finally:
        for s in sessions.values():
            s.close()

    def ratio(a, b, i):
        return statistics.median(x[i] / y[i] for x, y in zip(times[a], times[b]))

    out = {"tokens": tokens, "calls_per_round": calls, "rounds": rounds, "depths": list(depths), "pairs": []}
    for kd in kinds:
        out[f"p50_ms_readers{kd[0]}_tokens{kd[1]}"] = statistics.median(x[0] for x in times[kd]) * 1e3
    pairs = [((d, tokens), (d, 1)) for d in depths] + [((max(depths), tokens), (min(depths), 1))]
    for a, b in pairs:
        row = {"many_readers": a[0], "one_readers": b[0], "ratio_p50": ratio(a, b, 0), "ratio_mean": ratio(a, b, 1),
               "ratio_p50_rounds": [round(x[0] / y[0], 3) for x, y in zip(times[a], times[b])],
               "many_p50_ms": statistics.median(x[0] for x in times[a]) * 1e3,
               "one_p50_ms": statistics.median(x[0] for x in times[b]) * 1e3,
               "distinct_rows_per_batch": statistics.fmean(dist[a])}
        out["pairs"].append(row)
        print(f"   (b) step_many of {tokens} tokens ({row['distinct_rows_per_batch']:.0f} distinct rows of "
              f"{tokens * 48}) at readers {a[0]} vs step of one (48) at readers {b[0]}: p50 "
              f"{row['many_p50_ms']:.3f} vs {row['one_p50_ms']:.3f} ms, ratio {row['ratio_p50']:.3f} "
              f"(rounds {row['ratio_p50_rounds']}), means {row['ratio_mean']:.3f}")
    # each side at the readers that minimise it
    best = {n: min((d for d in depths), key=lambda d: statistics.median(x[0] for x in times[(d, n)]))
            for n in (1, tokens)}
    row = {"many_readers": best[tokens], "one_readers": best[1],
           "ratio_p50": ratio((best[tokens], tokens), (best[1], 1), 0),
           "ratio_mean": ratio((best[tokens], tokens), (best[1], 1), 1),
           "many_p50_ms": statistics.median(x[0] for x in times[(best[tokens], tokens)]) * 1e3,
           "one_p50_ms": statistics.median(x[0] for x in times[(best[1], 1)]) * 1e3}
    out["best"] = row
    print(f"   (b) each at its best readers: {tokens} tokens at {row['many_readers']} vs one at {row['one_readers']}: "
          f"p50 {row['many_p50_ms']:.3f} vs {row['one_p50_ms']:.3f} ms, ratio {row['ratio_p50']:.3f} "
          f"(means {row['ratio_mean']:.3f})")
    out["ratio_p50"] = row["ratio_p50"]
    return out


def fio_bursts(path, offset: int, size: int, n: int, seconds: float, bs: int) -> dict:
    """fio reading in bursts as a decode step does: ``n`` random ``bs``-byte O_DIRECT reads submitted
    together, all of them waited for, then the next ``n`` (``iodepth_batch_submit`` = ``iodepth_batch_complete_min``
    = ``n``).  One burst at a time, so a burst takes ``n / IOPS``."""
    cmd = ["fio", "--name=engram-bursts", f"--filename={path}", "--rw=randread", f"--bs={bs}", "--direct=1",
           "--ioengine=io_uring", f"--iodepth={n}", f"--iodepth_batch_submit={n}",
           f"--iodepth_batch_complete_min={n}", f"--iodepth_batch_complete_max={n}",
           f"--offset={offset // 4096 * 4096}", f"--size={size // 4096 * 4096}", f"--runtime={seconds}",
           "--time_based", "--randrepeat=0", "--norandommap", "--output-format=json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"fio failed (exit {res.returncode}, bursts of {n}): {res.stderr.strip()}")
    job = json.loads(res.stdout)["jobs"][0]["read"]
    return {"iops": job["iops"], "burst_ms": n / job["iops"] * 1e3 if job["iops"] else float("nan"),
            "cmd": " ".join(cmd)}


def fio_floor(fio: dict, rows_one: int, rows_many: int) -> dict:
    """The device's own floor from fio's IOPS at each depth: the time of ``n`` reads at depth ``d <= n``
    is ``n / IOPS(d)`` (Little's law; at ``d = n`` it is one read's mean latency at that depth); the best
    depth for each batch, and the ratio of the two times."""
    def best(n):
        got = [(n / fio[d]["iops"], d) for d in fio if d <= n and fio[d]["iops"] > 0]
        return min(got) if got else (float("nan"), 0)
    t1, d1 = best(rows_one)
    tn, dn = best(rows_many)
    return {"one_ms": t1 * 1e3, "one_depth": d1, "many_ms": tn * 1e3, "many_depth": dn, "ratio": tn / t1}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run speculative", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=0.005, help="model scale (default 0.005: 1.9 M rows a table)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=200, help="decode steps a round and side (part a)")
    p.add_argument("--calls", type=int, default=200, help="calls a round and side (part b)")
    p.add_argument("--k", type=int, default=2, help="drafts a step (part a); part b verifies k + 1 tokens")
    p.add_argument("--acceptance", type=float, default=0.7, help="probability that a draft is the true token")
    p.add_argument("--compute-ms", type=float, default=5.0, help="compute stand-in between steps (ms)")
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--readers", type=int, default=16, help="the sessions' readers: reads in flight a batch")
    p.add_argument("--fio-s", type=float, default=3.0, help="seconds of each fio run (skipped without fio)")
    args = p.parse_args(argv)
    from engram import load_tokenizer

    model = _model(args.scale, args.readers)
    loc = model.info.tables[model.layer_ids[0]]
    with model.session() as s:
        t = s.tables[model.layer_ids[0]]
        setup = {"direct": t.direct, "alignment": t.alignment, "backend": t.backend, "readers": t.readers,
                 "engine": t.engine is not None, "table_rows": loc.rows, "model": str(loc.path)}
    print(f"   model {loc.path} ({loc.rows} rows a table), O_DIRECT {setup['direct']}, backend {setup['backend']}, "
          f"readers {setup['readers']}, shared engine {setup['engine']}")
    ids = np.asarray(load_tokenizer().encode(real_text(), add_special_tokens=False).ids, dtype=np.int64)
    text = Text(ids)
    a = part_a(model, text, args.rounds, args.steps, args.compute_ms / 1e3, args.k, args.acceptance, args.seed)
    depths = sorted({args.readers, 48, 48 * (args.k + 1)})
    b = part_b(model, text, args.rounds, args.calls, args.k + 1, depths)
    fio = {}
    if shutil.which("fio"):  # what the device gives at the depths of a step and of a verification batch
        for qd in sorted({args.readers, 32, 48, 64, 96, 48 * (args.k + 1)}):
            r = fio_randread(loc.path, loc.offset, loc.rows * 264, qd, args.fio_s, bs=setup["alignment"])
            fio[qd] = {"iops": r["iops"], "p50_us": r["p50_us"]}
            print(f"   fio randread {setup['alignment']} B, O_DIRECT, queue depth {qd}: {r['iops']:.0f} IOPS, "
                  f"p50 {r['p50_us']:.0f} us")
    floor = fio_floor(fio, 48, 48 * (args.k + 1)) if fio else {}
    if floor:  # the same floor read in bursts: n reads submitted together and all waited for
        n = 48 * (args.k + 1)
        b1 = fio_bursts(loc.path, loc.offset, loc.rows * 264, 48, args.fio_s, setup["alignment"])
        bn = fio_bursts(loc.path, loc.offset, loc.rows * 264, n, args.fio_s, setup["alignment"])
        floor["bursts"] = {"one_ms": b1["burst_ms"], "many_ms": bn["burst_ms"],
                           "many_in_bursts_of_48_ms": (args.k + 1) * b1["burst_ms"],
                           "ratio": min(bn["burst_ms"], (args.k + 1) * b1["burst_ms"]) / b1["burst_ms"]}
        print(f"   fio bursts: {n} reads at once {bn['burst_ms']:.3f} ms, 48 at once {b1['burst_ms']:.3f} ms: floor "
              f"ratio {floor['bursts']['ratio']:.3f}")
        print(f"   fio floor: {48 * (args.k + 1)} reads at depth {floor['many_depth']} {floor['many_ms']:.3f} ms vs 48 "
              f"at depth {floor['one_depth']} {floor['one_ms']:.3f} ms: ratio {floor['ratio']:.3f}; the engine's "
              f"{b['ratio_p50']:.3f}")
    return {"args": vars(args), "setup": setup, "prefetch": a, "verification": b, "fio": fio, "fio_floor": floor,
            "load_average": os.getloadavg(),
            "targets": {"share_per_step_le": 0.35, "verification_ratio_le": 1.5},
            "met": {"share_per_step": a["share_per_step"] <= 0.35, "verification_ratio": b["ratio_p50"] <= 1.5}}


if __name__ == "__main__":
    main()
