"""Prefill: does the background reader hide the table reads behind the layers' compute?

An emulated engine runs a prompt in micro-batches of 2048 tokens through 43
decoder layers (llama.cpp-style: every layer on one micro-batch, then the
next), sleeping a fixed compute time per layer and micro-batch (a GPU's
compute leaves the CPU free) and waiting at the Engram layers (1 and 14) for
the rows of its micro-batch.  The reads are those of a real prompt (the
shared coding-agent system prompt, DeepSeek V4 tokenizer) from the synthetic
multi-GiB model of bench_table.

Side by side in one run: I/O alone (the prefetch with nobody waiting), compute
alone (the same loop without Engram waits), and both together, for compute
totals of about 0.5x, 1x and 2x the I/O time.  Target: wall time at most
1.1 x max(compute, I/O).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from .common import RESULTS, shared_data

LAYERS = 43  # decoder layers of the emulated model (ds4's V4 Flash count)


def engine(prefetcher, tokens: int, ubatch: int, per_layer_s: float, engram_layers) -> float:
    """Run the emulated layers; returns wall seconds (prefetcher None: compute only)."""
    t0 = time.perf_counter()
    for start in range(0, tokens, ubatch):
        stop = min(tokens, start + ubatch)
        for layer in range(LAYERS):
            if prefetcher is not None:
                prefetcher.enter_layer(layer)
                if layer in engram_layers:
                    prefetcher.wait(layer, stop)
            time.sleep(per_layer_s)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    from engram import EngramModel, load_tokenizer

    from .bench_table import _drop_cache, _model

    p = argparse.ArgumentParser(prog="bench_prefill")
    p.add_argument("--model", type=Path, default=RESULTS / "bench-model.gguf")
    p.add_argument("--scale", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--ubatch", type=int, default=2048, help="micro-batch of the engine and chunk of the reader")
    p.add_argument("--factors", default="0.5,1,2", help="compute total as multiples of the I/O time")
    args = p.parse_args(argv)

    _model(args.model, args.scale)  # built when missing; its header read and checked
    _drop_cache(args.model)
    text = (shared_data() / "agent_prompt_long.txt").read_text(encoding="utf-8")
    ids = np.array(load_tokenizer().encode(text, add_special_tokens=False).ids[: args.tokens])
    model = EngramModel.open(args.model)
    lids = set(model.layer_ids)

    def io_alone() -> float:
        with model.session() as s:
            t0 = time.perf_counter()
            pf = s.prefill(ids, chunk_tokens=args.ubatch)
            pf.enter_layer(LAYERS)
            for lid in model.layer_ids:
                pf.wait(lid)
            return time.perf_counter() - t0

    io = io_alone()
    nub = -(-len(ids) // args.ubatch)
    rows = []
    for f in [float(x) for x in args.factors.split(",")]:
        per_layer = f * io / (LAYERS * nub)
        compute = engine(None, len(ids), args.ubatch, per_layer, lids)
        with model.session() as s:
            t0 = time.perf_counter()
            pf = s.prefill(ids, chunk_tokens=args.ubatch)
            engine(pf, len(ids), args.ubatch, per_layer, lids)
            wall = time.perf_counter() - t0
        io_now = io_alone()
        io_mean = (io + io_now) / 2
        io = io_now
        bound = max(compute, io_mean)
        rows.append({"factor": f, "compute_s": compute, "io_s": io_mean, "wall_s": wall,
                     "ratio_to_max": wall / bound, "stall_s": wall - compute})
        print(f"   compute {compute:6.2f} s  I/O {io_mean:6.2f} s  together {wall:6.2f} s  "
              f"= {wall / bound:.3f} x max(compute, I/O)")
    return {"tokens": int(len(ids)), "ubatch": args.ubatch, "layers": LAYERS, "runs": rows}
