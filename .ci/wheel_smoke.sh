#!/usr/bin/env bash
# The wheel on a user's machine: build it, install it with the simulator's extras into a fresh virtual
# environment in a temporary folder outside the repo, and run from that folder -- the repo not on sys.path,
# no ENGRAM_SHARED_DATA -- the commands whose defaults read the package data (the corpora, the
# vm-virtio-16core-4k preset's device file) and the README's main commands that are quick.
#
# Usage: .ci/wheel_smoke.sh [PYTHON]   (default .venv/bin/python: it has Cython and numpy for the build)
# 5.2 minutes on a 2-core machine at load average 15 (the build compiles the Cython kernels; it and the install
# take a third of it); less on an idle CI machine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$repo/.venv/bin/python}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/engram-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset ENGRAM_SHARED_DATA
t0=$SECONDS

echo "-- building the wheel (in $tmp/dist)"
(cd "$repo" && "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/dist" .)
wheel=$(ls "$tmp"/dist/engram-*.whl)
echo "   $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
for f in sim/data/README.md sim/data/promessi_sposi.txt sim/data/agent_prompt_long.txt sim/data/prompts.jsonl \
         sim/data/devices/vm-virtio-16core-4k.jsonl sim/data/hosts/engine-cpu.json sim/studies/capacity.toml sim/studies/serve.toml engram/SPEC.md; do
    "$PY" -c "import sys, zipfile; sys.exit(0 if sys.argv[2] in zipfile.ZipFile(sys.argv[1]).namelist() else 1)" \
        "$wheel" "$f" || { echo "the wheel lacks $f"; exit 1; }
done

echo "-- a fresh virtual environment outside the repo ($tmp/venv)"
base=$("$PY" -c "import sys; print(sys._base_executable)")
"$base" -m venv "$tmp/venv"
# (pip's warnings about index folders absent on this machine are left out of the log)
"$tmp/venv/bin/python" -m pip install -q "$wheel[sim]" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }

cd "$tmp"
mkdir home && export HOME="$tmp/home"  # nothing of the repo's user either
E="$tmp/venv/bin/engram"
"$tmp/venv/bin/python" - "$repo" <<'EOF'
import sys
from pathlib import Path
import engram, sim
from sim.core.io import packaged_data_dir
repo = Path(sys.argv[1]).resolve()
for m in (engram, sim):
    where = Path(m.__file__).resolve()
    assert repo not in where.parents, f"{m.__name__} imported from the repo: {where}"
assert repo not in packaged_data_dir().resolve().parents, packaged_data_dir()
print(f"   engram and sim from {Path(sim.__file__).resolve().parent.parent}")
EOF

run() {
    local s=$SECONDS
    echo "+ engram $*"
    "$E" "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" || { cat "$tmp/out.txt" "$tmp/err.txt"; echo "FAILED: engram $*"; exit 1; }
    tail -n 2 "$tmp/out.txt" | sed 's/^/    /'
    echo "    ($((SECONDS - s)) s)"
}
run --help
run info
run sim --help
run sim decode --steps 300 --no-progress
run sim decode --device ssd:qd1_us=80,iops=500000 --sessions 64 --steps 100 --no-progress  # README
run sim decode --tail vm-virtio-16core-4k --steps 200 --quiet
run sim decode --device ssd:qd1_us=80,iops=500000 --sessions 16 --steps 100 --host-cpus 2 --quiet  # the engine's CPU profile
# sessions as processes: the packaged profile's process_cpu_ratio scales the CPU a step and a read
"$E" sim decode --device ssd:qd1_us=80,iops=500000 --sessions 16 --steps 100 --host-cpus 2 --host-sessions processes \
    --json > "$tmp/proc.json"
"$tmp/venv/bin/python" - "$tmp/proc.json" <<'PY'
import json, sys
from sim.decode.host import engine_profile
h, p = json.load(open(sys.argv[1]))["host"], engine_profile()
assert h["sessions"] == "processes", h
assert abs(h["step_cpu_us"] - p["step_cpu_us"] * p["process_cpu_ratio"]) < 1e-6, (h, p)
print("    sessions as processes: x", p["process_cpu_ratio"], "the CPU a step from the installed profile")
PY
run sim serve --no-progress                                                 # its defaults: 300 s simulated
run sim serve --rate 3 --duration-s 60 --device ssd:qd1_us=80,iops=600000 --compute-scale 10 --quiet  # README
run sim prefill --compute-tokens-per-s 2000 --limit 8192 --no-progress      # default: shared:agent_prompt_long.txt
run sim device
for name in $("$E" sim device --json | "$tmp/venv/bin/python" -c "import json, sys; print(' '.join(json.load(sys.stdin)['presets']))"); do
    run sim device "$name"
done
run sim device ssd:qd1_us=150,iops=90000                                    # README
for src in shared:promessi_sposi.txt shared:prompts.jsonl shared:agent_prompt_long.txt; do
    run sim trace stats "$src" --limit 4000 --lru 1024 --no-progress
done
run sim trace synth --reuse 0.225 --tokens 1000 --profile prose --no-progress
run sim capacity --device seed-apple-m3-ultra --device ssd:qd1_us=500,iops=20000,parallelism=8 --drives 1,2 \
    --target 20 --seeds 1 --max-sessions 32 --steps 100 --jobs 1 --out "$tmp/capacity.csv" --no-progress
run sim sweep studies/reuse.toml --out "$tmp/reuse.csv" --jobs 1 --no-progress  # README's form: the shipped study
run sim sweep reuse --out "$tmp/reuse-by-name.csv" --jobs 1 --no-progress       # or by its name
run synth "$tmp/m.gguf" --scale 0.0005 --no-progress
run inspect "$tmp/m.gguf"
run hash --text "Quel ramo del lago di Como"
run lookup "$tmp/m.gguf" --text "Quel ramo del lago di Como"
echo "-- wheel smoke test passed in $((SECONDS - t0)) s"
