"""`python -m serve serve.workers=2`: two processes on one port, each warmed up, both serving."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from serve.settings import ServeConfigError, ServeSettings

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_settings_travel_to_workers_unchanged():
    settings = ServeSettings(family="piper", source="teacher", length_buckets=(64, 128), model_aliases=("tts-1",), workers=3,
                             port=8123)
    assert ServeSettings.from_json(settings.to_json()) == settings
    with pytest.raises(ServeConfigError, match="fixed port"):
        ServeSettings(family="piper", source="teacher", workers=2, port=0)
    with pytest.raises(ServeConfigError, match="workers"):
        ServeSettings(family="piper", source="teacher", workers=0)


def test_two_workers_share_the_port(tmp_path):
    port = _free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "serve", "serve.source=original_onnx", "serve.workers=2", f"serve.port={port}",
               "serve.length_buckets=[32,96]", "serve.max_batch_size=2", "serve.threads=1",
               f"hydra.run.dir={tmp_path / 'hydra'}", f"paths.output_dir={tmp_path / 'outputs'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while log_path.read_text().count("ready: original_onnx") < 2:  # each worker warms up on its own
            assert server.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "two workers not ready within 120 s"
            time.sleep(0.5)
        body = b'{"model": "tts-1", "input": "Two workers, one port.", "voice": "alloy"}'
        for _ in range(4):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200
                assert response.read(4) == b"RIFF"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log_path.read_text()[-2000:]
    assert log_path.read_text().count("Started server process") == 2
