"""Shared helpers of the tests/test_serve_*.py files: settings from the real config, one loaded
model per process, a model whose synthesis waits on a gate, and a real uvicorn on a free port."""
from __future__ import annotations

import dataclasses
import functools
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import uvicorn
from fastapi.testclient import TestClient
from conftest import compose_config

from models.interface import SynthesisResult
from models.registry import get_family
from serve.app import create_app
from serve.engines import ServedModel, load_variant, served_as_is
from serve.settings import ServeSettings, serve_settings_from_config

# Small buckets and batches: warm-up takes a fraction of a second on CPU.
FAST = ["serve.source=original_onnx", "serve.length_buckets=[32,96]", "serve.max_batch_size=4",
        "serve.max_wait_ms=20", "serve.threads=1"]


def serve_settings(tmp_path: Path, *overrides: str) -> ServeSettings:
    """``serve`` settings of `python -m serve <FAST> <overrides>`, composed from conf/."""
    return serve_settings_from_config(compose_config(tmp_path, [*FAST, *overrides]))


@functools.cache
def served_variant(variant: str) -> ServedModel:
    """``original_onnx`` or ``teacher``, loaded once per test process."""
    return load_variant(get_family("piper"), variant, "bundled:joe", threads=1, device="cpu")


class GatedModel:
    """A TTSModel whose ``synthesize`` waits for ``gate`` (set by the test): work held in flight."""

    def __init__(self, inner):
        self.inner = inner
        self.sample_rate_hz = inner.sample_rate_hz
        self.gate = threading.Event()
        self.calls = 0

    def text_to_utterances(self, text):
        return self.inner.text_to_utterances(text)

    def synthesize(self, request):
        self.calls += 1
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        return self.inner.synthesize(request)

    def parts(self):
        return {}

    def replace_part(self, role, module):
        raise NotImplementedError


class ToneModel:
    """A served model's own frontend, and a quiet tone of ``seconds`` per sentence instead of synthesis:
    much audio at no synthesis time, for server tests about transport rather than speech."""

    def __init__(self, inner, seconds: float):
        self.inner, self.sample_rate_hz = inner, inner.sample_rate_hz
        self.samples = int(seconds * inner.sample_rate_hz)

    def text_to_utterances(self, text):
        return self.inner.text_to_utterances(text)

    def synthesize(self, request):
        rows = request.phoneme_ids.shape[0]
        audio = 0.1 * torch.sin(torch.arange(self.samples) / 10.0).repeat(rows, 1)  # (B, T_audio)
        return SynthesisResult(audio, torch.full((rows,), self.samples), self.sample_rate_hz)


def gated(served: ServedModel) -> tuple[ServedModel, GatedModel]:
    model = GatedModel(served.model)
    return dataclasses.replace(served, model=model), model


def wait_until(condition, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)


def tiny_family_app(family, model, tmp_path: Path, *overrides: str):
    """The server's app in front of ``model`` (the family's tiny model, or a wrapper of it) as the
    family's teacher, without a warm-up; returns (app, served model)."""
    torch.set_num_threads(1)
    settings = serve_settings(tmp_path, "serve.source=teacher", "serve.warmup=false", *overrides)
    served = served_as_is(model, family, "teacher", family.default_voice)
    return create_app(settings, served), served


@contextmanager
def tiny_family_client(family, model, tmp_path: Path, *overrides: str):
    """A TestClient of ``tiny_family_app``, ready; yields (client, voice id)."""
    app, served = tiny_family_app(family, model, tmp_path, *overrides)
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, timeout_s=30, what="/readyz 200")
        yield client, served.voice_name


@contextmanager
def running_server(app, graceful_s: int = 10):
    """The app under a real uvicorn on 127.0.0.1 and a free port; yields (server, base_url)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=graceful_s))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
