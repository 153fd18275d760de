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
python -m pytest -q --durations=20 "$@"
