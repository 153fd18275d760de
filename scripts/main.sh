#!/usr/bin/env bash
# The main job on the bundled Piper voice: teacher vs original ONNX, scored and logged to MLflow.
#   bash scripts/main.sh                 # any extra arguments are Hydra overrides
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
python -m compress +experiment=baseline "$@"
