#!/usr/bin/env bash
# The tests marked `gpu`, on the GPU machine. That machine has torch and pytest but not Hydra, which
# tests/conftest.py imports, so its dependencies travel in .device/testdeps (git-ignored, 6 MB):
#   here:   bash scripts/gpu_tests.sh --prepare
#   there:  (carry .device/testdeps, and what scripts/device_deps.sh installs)
#           bash scripts/gpu_tests.sh [pytest arguments, e.g. a test file]
# Without a path among the arguments it runs the files that hold `gpu` tests: collecting the whole
# suite there would import what the GPU machine lacks (mlflow, the voice packages) and stop at collection.
set -euo pipefail
deps=.device/testdeps
if [[ "${1:-}" == "--prepare" ]]; then
    rm -rf "$deps"  # pip --target skips what is already there: start clean so nothing stays stale
    # Hydra and OmegaConf are pure Python; PyYAML is built for the GPU machine's CPython 3.12.
    python3 -m pip install -q --target "$deps" --no-deps --python-version 3.12 --implementation cp --only-binary=:all: \
        --platform manylinux_2_17_x86_64 hydra-core==1.3.8 omegaconf==2.3.1 PyYAML==6.0.3
    # antlr4-python3-runtime 4.9.3 (OmegaConf's grammar) ships as a source archive only: its package is the src/ folder.
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download -q --no-deps --no-binary=:all: -d "$work" antlr4-python3-runtime==4.9.3
    tar xzf "$work"/antlr4-python3-runtime-4.9.3.tar.gz -C "$work"
    cp -r "$work"/antlr4-python3-runtime-4.9.3/src/antlr4 "$deps"/
    exit 0
fi
test -d "$deps/hydra" || { echo "no $deps: run 'bash scripts/gpu_tests.sh --prepare' here and carry it" >&2; exit 3; }
paths=()
for argument in "$@"; do
    [[ -e "${argument%%::*}" ]] && paths+=("$argument")
done
files=()
if [[ ${#paths[@]} -eq 0 ]]; then
    mapfile -t files < <(grep -rlE 'pytest\.mark\.gpu' tests | sort)
fi
PYTHONPATH="$deps:.${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" "${files[@]}"
