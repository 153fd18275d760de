#!/usr/bin/env bash
# The test suite, on a fresh machine or not:  bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
# The PyTriton test runs in its own venv (numpy<2; see scripts/pytriton_env.sh): build it first so
# the Triton path is tested, not skipped.
bash scripts/pytriton_env.sh >/dev/null
source scripts/setup_env.sh
# The layers of docs/architecture.md, declared in pyproject.toml: no upward imports, no circles.
lint-imports
# Two workers, each taking whole files, so a module's fixtures (an exported graph, a loaded voice) are
# built once. One process took 49 min on a 2-core CI machine; two workers took 18 min on a fresh
# clone on a 2-core AMD EPYC (not side by side: these machines vary by up to 2.5x).
# PYTEST_WORKERS=0 runs in one process, for a debugger. One torch intra-op thread per worker
# (tests/conftest.py reads TTS_TEST_TORCH_THREADS): two workers of two threads each on two cores made
# tests/export + tests/families take 409 s against 345 s with one (fresh clone, this AMD EPYC). Not
# OMP_NUM_THREADS: that also moves Whisper's (CTranslate2's) float kernels, and a 10 dB clip it
# transcribes cleanly with two threads sent its greedy decoder into a loop (WER 4.5) with one.
export TTS_TEST_TORCH_THREADS=${TTS_TEST_TORCH_THREADS:-$([ "${PYTEST_WORKERS:-2}" = 0 ] && echo 0 || echo 1)}
python -m pytest -q --durations=20 -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
