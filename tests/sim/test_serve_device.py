"""sim.serve.device: batches alone take their drawn time; shared, they agree with the decode model's segment queue."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.device import SegmentQueue, load_device
from sim.device.recorder import time_average
from sim.serve.device import BatchTimes, SharedDevice

DEVICES = ("seed-apple-m3-ultra", "vm-virtio-16core-4k", "ssd:qd1_us=80,iops=600000,parallelism=32")


@pytest.mark.parametrize("n", [1, 48, 300, 1000, 5003])
def test_fixed_latency_batches_take_the_exact_models_time(n):
    """A device of fixed latencies: the draw is the per-read simulation's makespan, even where it extrapolates."""
    dev = load_device("seed-apple-m3-ultra")
    bt = BatchTimes(dev, np.random.default_rng(0))
    want = dev.batch_samples(n, 16)[0]
    assert want.size == 1 and bt.draw(n, 16) == pytest.approx(float(want[0]), rel=1e-12)


@pytest.mark.parametrize("spec", ["vm-virtio-16core-4k", "ssd:qd1_us=80,iops=600000,parallelism=32"])
@pytest.mark.parametrize("n", [48, 4000])
def test_drawn_batches_have_the_exact_models_mean(spec, n):
    dev = load_device(spec)
    bt = BatchTimes(dev, np.random.default_rng(1))
    draws = np.asarray([bt.draw(n, 16) for _ in range(3000)])
    want = dev.batch_samples(n, 16, size=2048, rng=np.random.default_rng(9))[0]
    assert abs(draws.mean() / want.mean() - 1) < 0.02
    assert abs(draws.std() / want.std() - 1) < 0.25


def test_a_batch_alone_takes_its_time_and_two_share_the_device():
    dev = load_device("seed-apple-m3-ultra")  # 16 reads at once: two batches of 16 readers share them
    q = SharedDevice(dev)
    q.submit(0.0, 4800, 16, 0.06, "a")
    assert q.tnext == pytest.approx(0.06)
    assert q.complete(q.tnext) == ["a"]
    q.submit(1.0, 4800, 16, 0.06, "b")
    q.submit(1.0, 4800, 16, 0.06, "c")
    t = q.tnext
    assert t == pytest.approx(1.12) and sorted(q.complete(t)) == ["b", "c"]
    q.submit(2.0, 4800, 16, 0.06, "d")
    q.submit(2.03, 96, 16, 0.0012, "e")  # a decode batch arriving half-way: half the device for 2.4 ms
    assert q.tnext == pytest.approx(2.0324) and q.complete(q.tnext) == ["e"]
    assert q.tnext == pytest.approx(2.0612) and q.complete(q.tnext) == ["d"]
    assert q.reads == 3 * 4800 + 4800 + 96


def _replay(queue, dev, subs, ps: bool):
    done = {}
    i = 0
    while i < len(subs) or queue.tnext < math.inf:
        ta = subs[i][0] if i < len(subs) else math.inf
        if queue.tnext <= ta:
            t = queue.tnext
            for o in queue.complete(t):
                done[o if ps else o[0]] = t
        else:
            t, n = subs[i]
            nom = dev.nominal_batch(n, min(16, n))[0]
            if ps:
                queue.submit(t, n, 16, nom, i)
            else:
                queue.submit(t, n, 16, 1.0, i, 0.0, 1.0)
            i += 1
    return np.asarray([done[j] - subs[j][0] for j in range(len(subs))])


@pytest.mark.parametrize("spec", DEVICES)
def test_shared_batches_agree_with_the_decode_models_queue(spec):
    """Decode-sized and prefill-sized batches arriving at random: the fluid and the decode model's segment queue
    (slots, FIFO rounds) give the same mean time in the device within 1.5%, and 80% of the batches within 5% (a
    small batch meeting a big one in service shares it at once in the fluid, after one round of FIFO in the
    queue: up to 30% for a 48-read batch)."""
    dev = load_device(spec)
    rng = np.random.default_rng(0)
    subs = list(zip(np.cumsum(rng.exponential(0.004, 250)).tolist(), rng.choice([48, 200, 900, 3000], 250).tolist()))
    ps = _replay(SharedDevice(dev), dev, subs, True)
    seg = _replay(SegmentQueue(dev.saturation_depth(), dev.mean_latency, dev.straggler), dev, subs, False)
    assert abs(ps.mean() / seg.mean() - 1) < 0.015
    lo, hi = np.percentile(ps / seg - 1, [10, 90])
    assert -0.05 < lo and hi < 0.05


def test_littles_law_on_reads():
    """The time average of the reads in the device (its recorded depth) = reads/s x mean read latency."""
    dev = load_device("vm-virtio-16core-4k")
    q = SharedDevice(dev)
    bt = BatchTimes(dev, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    subs = list(zip(np.cumsum(rng.exponential(0.002, 300)).tolist(), rng.integers(20, 3000, 300).tolist()))
    i = 0
    while i < len(subs) or q.tnext < math.inf:
        if i < len(subs) and subs[i][0] < q.tnext:
            t, n = subs[i]
            q.submit(t, n, 16, bt.draw(n, 16), i)
            i += 1
        else:
            q.complete(q.tnext)
    end = q.t
    L = time_average(list(zip(q.times, q.depths)), end)
    X = q.reads / end
    R = q.batch_area / q.reads
    assert L == pytest.approx(X * R, rel=1e-9) and L == pytest.approx(q.area / end, rel=1e-9)
    assert q.batches == 300 and R > dev.mean_latency(1) * 0.5
