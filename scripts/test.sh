#!/usr/bin/env bash
# The test suite, on a fresh machine or not:  bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
python -m pytest -q "$@"
