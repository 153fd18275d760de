"""serve/gpu_sharing.py: the server's own CUDA MPS daemon. A stand-in control program on PATH records
how it is called, so the test runs on any machine: the daemon starts with a private pipe directory
before the workers would, the server's environment names that directory only while the daemon runs,
"quit" stops it, and a machine without the program gets a clear refusal.

    python -m pytest -q tests/serve/test_gpu_sharing.py
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from serve_support import serve_settings

from serve.gpu_sharing import LOG_ENV, MPS_CONTROL, PIPE_ENV, mps_daemon, shared_gpu
from serve.settings import ServeConfigError

# Each call appends: its arguments, the pipe and log directories it was given, and what came on stdin.
FAKE_CONTROL = """#!/bin/sh
stdin=""
if [ "$1" != "-d" ]; then stdin=$(cat); fi
printf '%s|%s|%s|%s\\n' "$*" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$stdin" >> "$MPS_CALLS"
exit "${MPS_EXIT:-0}"
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch) -> Path:
    """A stand-in ``nvidia-cuda-mps-control`` first on PATH; returns the file its calls go to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / MPS_CONTROL
    program.write_text(FAKE_CONTROL)
    program.chmod(0o755)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(calls))
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.setenv(LOG_ENV, "/the/users/own/log/dir")
    return calls


def recorded(calls: Path) -> list[list[str]]:
    return [line.split("|") for line in calls.read_text().splitlines()]


def test_the_daemon_runs_with_a_private_pipe_while_the_workers_would_and_quits_after(tmp_path, fake_control):
    log_dir = tmp_path / "mps_log"
    with mps_daemon(log_dir) as pipe_dir:
        assert pipe_dir.is_dir()
        assert os.environ[PIPE_ENV] == str(pipe_dir)  # what spawned workers inherit
        assert os.environ[LOG_ENV] == str(log_dir)
        assert recorded(fake_control) == [["-d", str(pipe_dir), str(log_dir), ""]]
    assert recorded(fake_control)[1] == ["", str(pipe_dir), str(log_dir), "quit"]
    assert PIPE_ENV not in os.environ
    assert os.environ[LOG_ENV] == "/the/users/own/log/dir"
    assert not pipe_dir.exists() and log_dir.is_dir()


def test_a_daemon_that_does_not_start_leaves_no_pipe_and_no_environment(tmp_path, fake_control, monkeypatch):
    monkeypatch.setenv("MPS_EXIT", "1")
    with pytest.raises(subprocess.CalledProcessError, match="returned non-zero exit status 1"):
        with mps_daemon(tmp_path / "mps_log"):
            pytest.fail("the body must not run without a daemon")
    assert PIPE_ENV not in os.environ
    pipe_dir = Path(recorded(fake_control)[0][1])
    assert not pipe_dir.exists()


def test_without_the_control_program_mps_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServeConfigError, match=f"needs {MPS_CONTROL} on PATH"):
        with shared_gpu("mps", tmp_path / "mps_log"):
            pass


def test_time_slices_start_nothing(tmp_path, fake_control):
    with shared_gpu("time_slices", tmp_path / "mps_log"):
        assert PIPE_ENV not in os.environ
    assert not fake_control.exists()


@pytest.mark.parametrize("overrides, message", [
    (["serve.gpu_sharing=slices"], r"serve.gpu_sharing='slices': use one of \['time_slices', 'mps'\]"),
    (["serve.gpu_sharing=mps", "serve.device=cuda"], "set serve.device=cuda and serve.workers >= 2"),
    (["serve.gpu_sharing=mps", "serve.workers=2", "serve.port=8000"], "set serve.device=cuda and serve.workers >= 2"),
])
def test_settings_that_cannot_share_a_gpu_fail_at_start(tmp_path, overrides, message):
    with pytest.raises(ServeConfigError, match=message):
        serve_settings(tmp_path, *overrides)


def test_two_cuda_workers_may_share_through_mps(tmp_path):
    settings = serve_settings(tmp_path, "serve.gpu_sharing=mps", "serve.workers=2", "serve.port=8000",
                              "serve.device=cuda", "serve.source=teacher")
    assert settings.gpu_sharing == "mps"
