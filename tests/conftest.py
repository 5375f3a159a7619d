"""Shared fixtures: the V4.1 layout and the real token map, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: The shared real corpora: ``$ENGRAM_SHARED_DATA``, else ``<repo>/../shared/data`` (as ``sim.io.shared_data_dir``).
SHARED_DATA = Path(os.environ.get("ENGRAM_SHARED_DATA") or TESTS.parent.parent / "shared" / "data")


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
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared corpora not found at {SHARED_DATA}")
    return SHARED_DATA
