"""The Engram consumer as a what-if input: presets, interpolation by batch, the decode and serving models."""

from __future__ import annotations

import pytest

from engram.errors import ArgumentError
from sim.core.params import CONSUMERS, Consumer, consumer_preset
from sim.serve.compute import StepCompute
from sim.serve.runner import point_objects
from sim.serve.study import SERVE_AXES, check_serve_point


def test_presets_and_interpolation():
    h = consumer_preset("h200")
    assert h.ms(1) == 0.155 and h.ms(64) == 0.25 and h.step_s(1) == pytest.approx(0.31e-3)
    assert h.ms(32) == pytest.approx(0.155 + 31 * (0.25 - 0.155) / 63)
    assert h.ms(128) == pytest.approx(0.25 + 64 * (0.25 - 0.155) / 63)  # past the last knot: its slope
    assert h.ms(0) == 0.0
    assert CONSUMERS["none"].step_s(64) == 0.0
    assert consumer_preset("cpu").step_s(1) > 20 * h.step_s(1)
    with pytest.raises(ArgumentError, match="one of none, cpu, h200"):
        consumer_preset("tpu")
    with pytest.raises(ArgumentError, match="increasing"):
        Consumer("x", ((4, 1.0), (2, 2.0)))


def test_step_compute_with_consumer_adds_each_layer_unscaled():
    base = StepCompute.reference(scale=10.0)
    h = consumer_preset("h200")
    sc = base.with_consumer(h)
    for b in (1, 2, 16, 64, 200):
        assert sc.mean_ms(b) == pytest.approx(base.mean_ms(b) + 2 * h.ms(b))
    assert sc.mean_ms(4, 100) == pytest.approx(base.mean_ms(4, 100) + 2 * h.ms(4) + 100 * 2 * h.slope_ms())
    assert base.with_consumer(CONSUMERS["none"]) is base
    assert "consumer h200" in sc.source


def test_serving_point_takes_the_consumer_axis():
    p = {k: d for k, (_, d, _) in SERVE_AXES.items()}
    p["consumer"] = "cpu"
    check_serve_point(p, "point")
    c = point_objects(p)["compute"]
    assert c.mean_ms(1) == pytest.approx(StepCompute.reference().mean_ms(1) + 2 * consumer_preset("cpu").ms(1))
    p["consumer"] = "gpu"
    with pytest.raises(ArgumentError, match="consumer = 'gpu'"):
        check_serve_point(p, "point")
