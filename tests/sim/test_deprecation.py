"""Names that moved keep working from their old module, with a DeprecationWarning naming the new home."""

from __future__ import annotations

import importlib

import pytest

import sim.device
import sim.io
import sim.measure
import sim.schema


@pytest.mark.parametrize("old, name, new", [
    ("sim.measure", "load_json", sim.io.load_json),
    ("sim.measure", "RunConfig", sim.schema.RunConfig),
    ("sim.measure", "ComputeSpec", sim.schema.ComputeSpec),
    ("sim.measure", "MICRO_SCHEMA", sim.schema.MICRO_SCHEMA),
    ("sim.measure", "RUNS_SCHEMA", sim.schema.RUNS_SCHEMA),
    ("sim.measure", "STEP_ROWS", sim.schema.STEP_ROWS),
    ("sim.measure", "trace_label", sim.schema.trace_label),
    ("sim.device", "read_jsonl", sim.io.read_jsonl),
    ("sim.device", "US", sim.schema.US),
])
def test_moved_names_warn_and_resolve(old, name, new):
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to sim\.(io|schema)\.{name}"):
        got = getattr(importlib.import_module(old), name)
    assert got is new


def test_from_import_of_a_moved_name():
    with pytest.warns(DeprecationWarning, match="sim.schema.RunConfig"):
        from sim.measure import RunConfig
    assert RunConfig is sim.schema.RunConfig


def test_unknown_names_still_fail():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sim.measure.nope
    with pytest.raises(ImportError, match="cannot import name 'nope' from 'sim.device'"):
        from sim.device import nope
        pytest.fail(f"from sim.device import nope gave {nope!r}")
