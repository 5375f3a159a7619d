# `make demo` and `make test` set up .venv on first use (and after a change to
# the build files or the Cython sources), then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the engine's kernels, and the text of the simulator's fast loop that the build compiles (setup.py)
NATIVE := $(wildcard engram/_native/*.pyx engram/_native/*.pxd engram/_native/*.h) sim/decode/lean_loop.py \
          sim/device/fluid.py

.PHONY: setup demo test test-heavy bench clean

setup: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml $(NATIVE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "setuptools>=64" wheel "Cython>=3.0" "numpy>=1.24"
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/engram demo

test: $(STAMP)
	$(BIN)/python -m pytest

# Disk-heavy tests; pytest's exit 5 (none selected) counts as a pass.
test-heavy: $(STAMP)
	$(BIN)/python -m pytest -m heavy; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf build $(VENV) engram/_native/*.c engram/_native/*.so sim/decode/_native/*.so *.egg-info
