"""serve/gpu_loadtest.sh refuses settings it cannot run before it starts a server: a device call spent
on a run that cannot work is minutes of GPU time lost, so each refusal must come at once, name what is
missing and leave no server behind.

    python -m pytest -q tests/serve/test_gpu_loadtest_script.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "serve" / "gpu_loadtest.sh"


def run_script(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    """The script with ``settings`` as its environment, on a PATH of the shell's basics and this
    interpreter as ``python`` (a wrapper, so that a virtual environment stays in force)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": str(tmp_path), "OUT": str(tmp_path / "out"),
           "WHEELS": str(tmp_path / "no_wheels"), "SITE": str(tmp_path / "site"), **settings}
    return subprocess.run(["bash", str(SCRIPT)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_mps_without_its_control_program_is_refused_before_a_server_starts(tmp_path):
    path = os.pathsep.join(["/usr/bin", "/bin"])
    if shutil.which("nvidia-cuda-mps-control", path=path):
        pytest.skip("this machine has CUDA MPS where the test's PATH looks")
    result = run_script(tmp_path, MPS="1", WORKERS="2")
    assert result.returncode == 2, result.stderr
    assert "MPS=1 needs nvidia-cuda-mps-control" in result.stderr
    assert not (tmp_path / "out" / "server.log").exists()


def test_the_original_onnx_source_with_a_converted_voice_is_refused(tmp_path):
    result = run_script(tmp_path, SOURCE="original_onnx", VOICE="voice.safetensors")
    assert result.returncode == 2
    assert "set VOICE to the voice's .onnx" in result.stderr
    assert not (tmp_path / "out").exists()
