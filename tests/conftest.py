"""Shared fixtures: the V4.1 layout and the real token map, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent



@pytest.fixture(scope="session")
def layout():
    from engram import Layout

    return Layout.deepseek_v41_flash()


@pytest.fixture(scope="session")
def token_map():
    from engram import build_token_map

    return build_token_map()


@pytest.fixture(scope="session")
def tokenizer():
    from engram import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real corpora the package ships (``sim/data/``, read through importlib.resources): always there."""
    from sim.core.io import packaged_data_dir

    return packaged_data_dir()
