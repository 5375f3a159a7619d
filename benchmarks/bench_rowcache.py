"""The row cache (engram.RowCache): hits against O_DIRECT reads, the bookkeeping a miss pays, the lock, and
hit rates on the shipped texts, engine against simulator.

Part 1, a hit against a read: single rows of one table read with ``Table.read_rows`` (serial backend,
``O_DIRECT``) by a table without a cache, against other rows served by a table with one (lookup under the lock,
copy of the 264-byte record, decode).  Each round draws two disjoint sets of random rows: the reads take rows
this part has not read before, so no cache below the engine (the drive's, the hypervisor's) holds them, as for
a decode step's miss; the hits take the other set, read once untimed to fill the cache.  The same rows are not
used for both because a row read once may stay in those lower caches, and reading it again would time them
rather than the device.  Rows/s, medians over interleaved rounds.  Beside it the same for whole decode steps
(48 random rows of both tables through a ``TableGroup``: fresh steps read without a cache, other steps once held
in one).

Part 2, the cost of a miss: decode steps of 48 rows never read before (so every row misses) through a
``TableGroup`` with a full 16 MiB W-TinyLFU cache on (every miss evicts) and off, interleaved step by step; the ratio of the p50 step times (and the means),
the calling thread's CPU a step (median), the load average before and after; the bookkeeping alone timed by
itself.

Part 3, the lock: a 48-key batch's lookup and insert calls of the policy alone, with the cache's lock, and with
the lock taken by two threads at once.  Parts 2 and 3 also give CPU time (``time.thread_time``), which a
machine shared with other work does not inflate as it does wall time.

Part 4, hit rates on the shipped texts (``promessi_sposi.txt``, ``agent_prompt_long.txt``; the first
``--tokens`` tokens, hashed with the model's layout): one engine session decoding the text through a fresh cache
of each size and policy, its measured hit rate against ``engram sim trace reuse``'s prediction on the same trace,
and the optimal bound.

The model is built once under benchmarks/results/ (``--scale``, default 0.005: two tables of 1.9 M rows).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from .common import RESULTS, shared_data


def _model(scale: float) -> Path:
    from engram.synth import ModelShape, build_model

    path = RESULTS / f"rowcache-model-s{scale:g}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"   building {path} (scale {scale}) ...")
        build_model(path, ModelShape(scale=scale), progress=False)
    return path


def hit_vs_read(model, rounds: int, n: int, seed: int) -> dict:
    from engram import RowCache, Table, TableGroup

    info = model.info
    loc = info.tables[model.layer_ids[0]]
    rng = np.random.default_rng(seed)
    ids = rng.permutation(loc.rows)[: rounds * n * 2].reshape(rounds, 2, n)
    single = {"read": [], "hit": []}
    steps = {"read": [], "hit": []}
    with Table(loc.path, loc.offset, loc.rows, backend="serial", direct=True) as t, \
            Table(loc.path, loc.offset, loc.rows, backend="serial", direct=True) as tc:
        cache = RowCache(264 * 2 * n + 264, "lru")
        tc.attach_cache(cache, model.layer_ids[0])
        for r in range(rounds):
            fresh, held = ids[r, 0], ids[r, 1]
            for i in held:                                   # fill: these rows are then held
                tc.read_rows([int(i)])
            t0 = time.perf_counter()
            for i in fresh:
                t.read_rows([int(i)])
            t1 = time.perf_counter()
            for i in held:
                tc.read_rows([int(i)])
            t2 = time.perf_counter()
            assert tc.last_stats.cache_hits == 1
            single["read"].append(n / (t1 - t0))
            single["hit"].append(n / (t2 - t1))
    tables = [info.tables[lid] for lid in model.layer_ids]
    opened = [Table(x.path, x.offset, x.rows, direct=True, readers=48) for x in tables]
    try:
        g_plain = TableGroup(opened, 24, readers=48)
        g_cache = TableGroup(opened, 24, readers=48)
        k = 200
        cache = RowCache(264 * 48 * k + 264, "lru")
        g_cache.attach_cache(cache, model.layer_ids)
        for r in range(rounds):
            batch = np.stack([rng.integers(0, x.rows, (2 * k, 24)) for x in tables], axis=1).reshape(2 * k, 48)
            fresh, held = batch[:k], batch[k:]
            for b in held:
                g_cache.read_batch(b.reshape(1, 48))
            t0 = time.perf_counter()
            for b in fresh:
                g_plain.read_batch(b.reshape(1, 48))
            t1 = time.perf_counter()
            for b in held:
                g_cache.read_batch(b.reshape(1, 48))
            t2 = time.perf_counter()
            steps["read"].append(k / (t1 - t0))
            steps["hit"].append(k / (t2 - t1))
            cache.clear()
        g_plain.close()
        g_cache.close()
    finally:
        for x in opened:
            x.close()
    med = {k_: {m: statistics.median(v) for m, v in d.items()} for k_, d in (("single", single), ("step", steps))}
    return {"rows_per_s": med, "ratio_single": med["single"]["hit"] / med["single"]["read"],
            "ratio_step": med["step"]["hit"] / med["step"]["read"], "rounds": rounds, "rows_a_round": n}


def _fill(cache) -> None:
    """Fill ``cache`` to its capacity with records of rows no benchmark reads (layer 99), every page of its arena
    touched: the steady state of a long-running server."""
    col = np.full(48, 99 << 32, np.uint64)
    raw = np.zeros((48, 264), np.uint8)
    keys, skip, out = np.empty(48, np.uint64), np.empty(48, np.uint8), np.empty((48, 256), np.float32)
    start = 0
    while cache.entries < cache.capacity:
        ids = np.arange(start, start + 48, dtype=np.uint32).reshape(1, 48)
        cache.serve(ids, col, keys, out, skip)
        cache.admit(keys, skip, raw)
        start += 48


def miss_cost(model, steps: int, rounds: int, seed: int) -> dict:
    """Decode steps whose 48 rows were never read: the cache on (every row misses) against off, and on with a cache
    of 96 rows (its structures stay in the CPU's caches: the fixed part of the cost, calls and bookkeeping, without
    the memory accesses of a big cache), the three interleaved step by step in a rotating order.  Per step the wall time, the calling thread's CPU time (the cache's work is
    all there) and the process's CPU time (the readers' threads too)."""
    import os

    from engram import RowCache, Table, TableGroup

    info = model.info
    tables = [info.tables[lid] for lid in model.layer_ids]
    rng = np.random.default_rng(seed)
    need = rounds * steps * 3 * 24
    perm = [rng.permutation(x.rows)[:need].reshape(rounds, 3, steps, 24) for x in tables]
    opened = [Table(x.path, x.offset, x.rows, direct=True, readers=48) for x in tables]
    arms = ("off", "on", "on_96_rows")
    wall = {a: [] for a in arms}
    cpu = {a: [] for a in arms}
    proc = {a: [] for a in arms}
    timed = {"serve": []}
    load0 = os.getloadavg()
    try:
        groups = {a: TableGroup(opened, 24, readers=48) for a in arms}
        cache = RowCache("16M", "tinylfu")
        _fill(cache)  # a full cache: every miss now evicts, as in a long-running server
        groups["on"].attach_cache(cache, model.layer_ids)
        small = RowCache(96 * 264, "tinylfu")
        _fill(small)
        groups["on_96_rows"].attach_cache(small, model.layer_ids)
        serve = cache.serve

        def timed_serve(*a):
            c0 = time.thread_time()
            h = serve(*a)
            timed["serve"].append(time.thread_time() - c0)
            return h

        for r in range(rounds):
            ids = {a: np.concatenate([perm[0][r, j], perm[1][r, j]], axis=1) for j, a in enumerate(arms)}
            if r == rounds - 1:  # the last round also times the lookup inside real steps (the reader inserts)
                cache.serve = timed_serve
            for i in range(steps):  # interleaved step by step, the order rotating
                for a in arms[i % 3:] + arms[:i % 3]:
                    p0, c0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
                    groups[a].read_batch(ids[a][i].reshape(1, 48))
                    wall[a].append(time.perf_counter() - t0)
                    cpu[a].append(time.thread_time() - c0)
                    proc[a].append(time.process_time() - p0)
            assert groups["on"].last_stats.cache_hits == 0
        for g in groups.values():
            g.close()
    finally:
        for x in opened:
            x.close()
    load1 = os.getloadavg()
    out = {"steps": len(wall["off"]), "load_before": list(load0), "load_after": list(load1)}
    for a in arms:
        w, c, p = np.array(wall[a]), np.array(cpu[a]), np.array(proc[a])
        out[a] = {"p50_ms": float(np.median(w) * 1e3), "mean_ms": float(w.mean() * 1e3),
                  "cpu_p50_us": float(np.median(c) * 1e6), "cpu_mean_us": float(c.mean() * 1e6),
                  "process_cpu_p50_us": float(np.median(p) * 1e6)}
    off = out["off"]
    for a in arms[1:]:
        o = out[a]
        o.update(p50_ratio=o["p50_ms"] / off["p50_ms"], mean_ratio=o["mean_ms"] / off["mean_ms"],
                 cpu_p50_extra_us=o["cpu_p50_us"] - off["cpu_p50_us"],
                 cpu_share_of_p50_step=(o["cpu_p50_us"] - off["cpu_p50_us"]) / (off["p50_ms"] * 1e3))
    out["serve_p50_us"] = float(np.median(timed["serve"]) * 1e6)
    return out


def bookkeeping(repeat: int = 20000) -> dict:
    """A 48-row batch's cache work alone, as a serial read does it (``RowCache.serve`` then ``admit`` of 48
    misses; a pooled or ring read does the same policy work as a reservation while its reads fly, then a fill):
    the policy calls alone, with the cache's lock and records, and from two threads at once."""
    from engram import RowCache

    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 1 << 30, (1, 48)).astype(np.uint32) for _ in range(repeat)]
    col = np.zeros(48, np.uint64)
    col[24:] = np.uint64(14 << 32)
    col[:24] = np.uint64(1 << 32)
    raw = np.zeros((48, 264), np.uint8)

    def bufs():
        return np.empty(48, np.uint64), np.empty(48, np.uint8), np.empty((48, 256), np.float32)

    cache = RowCache("64M", "tinylfu")
    keys, skip, out = bufs()
    pol, rec = cache._policy, cache._records
    t0 = time.thread_time()
    for a in ids:
        pol.serve(a, col, keys, rec, out, skip)
        pol.admit(keys, skip, raw, rec)
    policy_us = (time.thread_time() - t0) / repeat * 1e6
    cache = RowCache("64M", "tinylfu")
    t0 = time.thread_time()
    for a in ids:
        cache.serve(a, col, keys, out, skip)
        cache.admit(keys, skip, raw)
    locked_us = (time.thread_time() - t0) / repeat * 1e6
    cache2 = RowCache("64M", "tinylfu")
    half = repeat // 2

    cpu = []

    def work(part):
        k, sk, o = bufs()
        c0 = time.thread_time()
        for a in part:
            cache2.serve(a, col, k, o, sk)
            cache2.admit(k, sk, raw)
        cpu.append(time.thread_time() - c0)

    th = [threading.Thread(target=work, args=(ids[i * half:(i + 1) * half],)) for i in range(2)]
    t0 = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    two_us = sum(cpu) / (2 * half) * 1e6  # CPU time a batch, the lock's waits and hand-overs included
    # one row held: what serving a hit costs the cache itself (lookup, touch, decode)
    one = np.array([[5]], np.uint32)
    k1, s1, o1 = np.empty(1, np.uint64), np.empty(1, np.uint8), np.empty((1, 256), np.float32)
    cache.serve(one, col[:1].copy(), k1, o1, s1)
    cache.admit(k1, s1, raw[:1])
    c1 = col[:1].copy()
    t0 = time.thread_time()
    for _ in range(repeat):
        cache.serve(one, c1, k1, o1, s1)
    hit_us = (time.thread_time() - t0) / repeat * 1e6
    return {"policy_us": policy_us, "cache_us": locked_us, "two_threads_us": two_us,
            "contended": cache2.stats()["contended"], "batches": repeat, "one_hit_us": hit_us}


def hit_rates(model_path, texts, tokens: int, sizes, policies) -> list:
    from engram import EngramModel, RowCache, load_tokenizer
    from engram.rowcache import parse_size
    from sim.trace import Trace
    from sim.trace.rowcache import cache_curve

    tok = load_tokenizer()
    out = []
    for name in texts:
        text = (shared_data() / name).read_text(encoding="utf-8")
        ids = np.array(tok.encode(text, add_special_tokens=False).ids[:tokens])
        model = EngramModel.open(model_path, readers=48)
        trace = Trace.from_tokens(ids, layout=model.layout, source=f"shared:{name}")
        curve = cache_curve(trace, sizes, policies)
        for pt in curve.points:
            for pol in policies:
                model = EngramModel.open(model_path, readers=48, cache=RowCache(parse_size(pt.bytes), pol))
                t0 = time.perf_counter()
                with model.session() as s:
                    for t in ids:
                        s.step(int(t))
                wall = time.perf_counter() - t0
                measured = model.cache.stats()["hit_rate"]
                out.append({"text": name, "tokens": int(ids.size), "bytes": pt.bytes, "rows": pt.rows, "policy": pol,
                            "measured": measured, "predicted": pt.hit_rate[pol], "optimal": pt.hit_rate["optimal"],
                            "tokens_per_s": ids.size / wall})
                print(f"   {name} {pt.bytes >> 20} MiB {pol}: measured {measured:.4f} predicted "
                      f"{pt.hit_rate[pol]:.4f} optimal {pt.hit_rate['optimal']:.4f}")
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run rowcache", description=__doc__)
    p.add_argument("--scale", type=float, default=0.005)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", type=int, default=300, help="single rows a round (part 1)")
    p.add_argument("--steps", type=int, default=300, help="decode steps a round and side (part 2)")
    p.add_argument("--tokens", type=int, default=6000, help="tokens of each text (part 4)")
    p.add_argument("--sizes", default="1M,4M,16M", help="cache sizes of part 4")
    p.add_argument("--only", choices=("io", "rates"), help="only parts 1-3 or only part 4")
    args = p.parse_args(argv)
    from engram import EngramModel

    path = _model(args.scale)
    model = EngramModel.open(path)
    rec = {"scale": args.scale, "model": str(path)}
    if args.only != "rates":
        rec["hit_vs_read"] = h = hit_vs_read(model, args.rounds, args.rows, 1)
        print(f"   single row: hit {h['rows_per_s']['single']['hit']:,.0f} rows/s, O_DIRECT read "
              f"{h['rows_per_s']['single']['read']:,.0f} rows/s: {h['ratio_single']:.1f}x")
        print(f"   decode step (48 rows): hit {h['rows_per_s']['step']['hit']:,.0f} steps/s, read "
              f"{h['rows_per_s']['step']['read']:,.0f} steps/s: {h['ratio_step']:.1f}x")
        rec["miss_cost"] = m = miss_cost(model, args.steps, args.rounds, 2)
        for a in ("on", "on_96_rows"):
            o = m[a]
            print(f"   miss ({a}): p50 step {o['p50_ms']:.3f} ms vs {m['off']['p50_ms']:.3f} ms off: "
                  f"{(o['p50_ratio'] - 1) * 100:+.2f}% (means {(o['mean_ratio'] - 1) * 100:+.2f}%); the caller's CPU "
                  f"p50 {o['cpu_p50_us']:.1f} us vs {m['off']['cpu_p50_us']:.1f} us: {o['cpu_p50_extra_us']:+.1f} us, "
                  f"{o['cpu_share_of_p50_step'] * 100:+.2f}% of the p50 step")
        print(f"   inside real steps: serve {m['serve_p50_us']:.1f} us (CPU p50; the misses are reserved and filled "
              f"inside the read); load average {m['load_before'][0]:.1f} before, {m['load_after'][0]:.1f} after")
        rec["bookkeeping"] = b = bookkeeping()
        print(f"   48-row batch bookkeeping: policy {b['policy_us']:.1f} us, with the lock and records "
              f"{b['cache_us']:.1f} us, two threads {b['two_threads_us']:.1f} us a batch ({b['contended']} contended)")
        read_us = 1e6 / h["rows_per_s"]["single"]["read"]
        rec["one_hit_ratio"] = read_us / b["one_hit_us"]
        print(f"   one hit served by the cache (RowCache.serve: lookup, decode) {b['one_hit_us']:.2f} us against "
              f"an O_DIRECT read of one row {read_us:.1f} us: {rec['one_hit_ratio']:.0f}x")
    if args.only != "io":
        sizes = [s for s in args.sizes.split(",") if s]
        rec["hit_rates"] = hit_rates(path, ["promessi_sposi.txt", "agent_prompt_long.txt"], args.tokens, sizes,
                                     ["lru", "tinylfu"])
    return rec


if __name__ == "__main__":
    main()
