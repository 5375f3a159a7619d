"""The package carries what its defaults need: the corpora and device files of ``sim/data/``, found through
importlib.resources, byte for byte those its README records, and every name that reads them resolving."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from engram.errors import ArgumentError
from sim.device import PRESET_FILES, preset, preset_names
from sim.core.io import PACKAGED_DATA, packaged_data_dir, packaged_data_path, shared_data_dir
from sim.trace import SHARED_SOURCES, builtin_sources, load_trace, resolve_source
from sim.trace.shape import PROFILES

ROOT = Path(__file__).resolve().parents[2]
SETUP_CFG = ROOT / "setup.cfg"


def recorded() -> dict:
    """``file -> (bytes, sha256)`` of the table in sim/data/README.md."""
    text = packaged_data_path("README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([^`]+)` \|.*\| (\d+) \| `([0-9a-f]{64})` \|$", text, flags=re.M)
    return {name: (int(size), sha) for name, size, sha in rows}


def test_the_readme_records_every_packaged_file_and_nothing_else():
    files = {p.relative_to(packaged_data_dir()).as_posix() for p in packaged_data_dir().rglob("*")
             if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts}
    assert len(recorded()) == 5
    assert set(recorded()) == files


@pytest.mark.parametrize("name", sorted(recorded()))
def test_packaged_files_are_the_recorded_bytes(name):
    size, sha = recorded()[name]
    res = resources.files("sim").joinpath(PACKAGED_DATA, *name.split("/"))
    data = res.read_bytes()  # through importlib.resources, as an installed wheel reads it
    assert len(data) == size
    assert hashlib.sha256(data).hexdigest() == sha
    assert packaged_data_path(name).read_bytes() == data


def test_setup_cfg_declares_every_packaged_file_as_package_data():
    from fnmatch import fnmatch

    text = SETUP_CFG.read_text(encoding="utf-8")
    line = re.search(r"^sim = (.+)$", text, flags=re.M)
    assert line, "setup.cfg [options.package_data] has no line for sim"
    patterns = [p.strip() for p in line.group(1).split(",")]
    for name in [*recorded(), "README.md"]:
        assert any(fnmatch(f"{PACKAGED_DATA}/{name}", p) for p in patterns), name


@pytest.mark.parametrize("name", sorted(SHARED_SOURCES))
def test_every_shared_name_resolves_to_the_packaged_copy(name, monkeypatch):
    monkeypatch.delenv("ENGRAM_SHARED_DATA", raising=False)
    kind, path = resolve_source(f"shared:{name}")
    assert Path(path) == packaged_data_path(name)
    assert kind == ("prompts" if name.endswith(".jsonl") else "textfile")
    assert f"shared:{name}" in builtin_sources()
    assert name in recorded()


def test_the_default_never_looks_beside_the_checkout(monkeypatch):
    monkeypatch.delenv("ENGRAM_SHARED_DATA", raising=False)
    assert shared_data_dir() == packaged_data_dir()
    assert packaged_data_dir() == Path(str(resources.files("sim").joinpath(PACKAGED_DATA)))
    assert ROOT.parent / "shared" not in shared_data_dir().parents


def test_a_folder_of_ones_own_replaces_the_packaged_texts(monkeypatch, tmp_path):
    (tmp_path / "promessi_sposi.txt").write_text("Quel ramo del lago di Como, che volge a mezzogiorno",
                                                 encoding="utf-8")
    monkeypatch.setenv("ENGRAM_SHARED_DATA", str(tmp_path))
    assert resolve_source("shared:promessi_sposi.txt") == ("textfile", tmp_path / "promessi_sposi.txt")
    assert load_trace("shared:promessi_sposi.txt").steps < 50
    with pytest.raises(ArgumentError, match=r"shared:prompts.jsonl.*ENGRAM_SHARED_DATA"):
        resolve_source("shared:prompts.jsonl")


def test_an_unknown_shared_name_lists_the_packaged_ones(monkeypatch):
    monkeypatch.delenv("ENGRAM_SHARED_DATA", raising=False)
    with pytest.raises(ArgumentError, match=r"shared:nope.txt.*promessi_sposi.txt, prompts.jsonl"):
        resolve_source("shared:nope.txt")


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_from_the_package(name, monkeypatch, tmp_path):
    monkeypatch.setenv("ENGRAM_SHARED_DATA", str(tmp_path / "absent"))  # presets never read that folder
    dev = preset(name)
    assert dev.name == name
    assert dev.mean_latency(1) > 0
    if name in PRESET_FILES:
        assert PRESET_FILES[name] in recorded()
        assert str(packaged_data_path(PRESET_FILES[name])) in dev.source


def test_the_measured_preset_is_its_file():
    dev = preset("vm-virtio-16core-4k")
    recs = [json.loads(x) for x in packaged_data_path("devices/vm-virtio-16core-4k.jsonl").read_text().splitlines()
            if x.strip()]
    first = min(recs, key=lambda r: r["qd"])
    assert dev.mean_latency(first["qd"]) == pytest.approx(first["qd"] / first["iops"], rel=1e-9)


def test_the_trace_profiles_name_packaged_texts():
    for prof in PROFILES.values():
        if prof.source.startswith("shared:"):
            assert prof.source[7:] in SHARED_SOURCES
