"""A model that fails, under a real uvicorn on loopback: the client gets a JSON 500 before any audio
and a stream cut short (no final chunk) after; the server logs it once, with one traceback, and
never lets it reach uvicorn ("Exception in ASGI application"). Before: a failure after the first
chunk logged two tracebacks (the app's "unhandled error" and uvicorn's) or only uvicorn's.

    python -m pytest -q tests/serve/test_serve_model_errors.py
"""
from __future__ import annotations

import dataclasses
import logging

import httpx
import pytest
from serve_support import running_server, serve_settings, served_variant, wait_until

from serve.app import create_app

pytestmark = pytest.mark.slow  # loads the real voice

TWO_SENTENCES = {"model": "tts-1", "voice": "alloy", "input": "Bring the red kite. Then fly it over the hill."}


class FailingModel:
    """The real voice, whose ``synthesize`` raises from call ``fail_from`` on (one sentence a call here)."""

    def __init__(self, inner, fail_from: int, in_frontend: bool = False):
        self.inner, self.fail_from, self.in_frontend = inner, fail_from, in_frontend
        self.sample_rate_hz = inner.sample_rate_hz
        self.calls = 0

    def text_to_utterances(self, text):
        if self.in_frontend:
            raise RuntimeError("frontend table missing")
        return self.inner.text_to_utterances(text)

    def synthesize(self, request):
        self.calls += 1
        if self.calls >= self.fail_from:
            raise RuntimeError("decoder blew up")
        return self.inner.synthesize(request)


def serve_failing(tmp_path, model: FailingModel):
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.max_batch_size=1")
    served = served_variant("original_onnx")
    return create_app(settings, dataclasses.replace(served, model=model))


def errors_logged(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]


def metric(app, name: str, **labels) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("response_format", ["wav", "flac"])
def test_a_failure_before_any_audio_answers_500_logged_once(tmp_path, server_log, response_format):
    """The first sentence fails (wav), or the second while flac waits for the whole file."""
    model = FailingModel(served_variant("original_onnx").model, fail_from=1 if response_format == "wav" else 2)
    app = serve_failing(tmp_path, model)
    with running_server(app) as (_, base_url):
        response = httpx.post(f"{base_url}/v1/audio/speech", json={**TWO_SENTENCES, "response_format": response_format},
                              timeout=30)
        wait_until(lambda: app.state.serve.admitted == 0, what="slot freed")
        after = httpx.get(f"{base_url}/healthz")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "synthesis_failed"
    assert "RuntimeError" in response.json()["error"]["message"]
    assert "decoder blew up" not in response.text  # the model's own text stays in the server log
    (record,) = errors_logged(server_log)
    assert "synthesis_failed" in record.getMessage() and "RuntimeError: decoder blew up" in record.getMessage()
    assert record.exc_info is not None
    assert metric(app, "tts_rejected_requests_total", reason="synthesis_failed") == 1
    assert after.status_code == 200


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_failure_mid_stream_cuts_it_logged_once(tmp_path, server_log, stream_format):
    model = FailingModel(served_variant("original_onnx").model, fail_from=2)
    app = serve_failing(tmp_path, model)
    received = b""
    with running_server(app) as (_, base_url):
        with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never ends
            with httpx.stream("POST", f"{base_url}/v1/audio/speech", timeout=30,
                              json={**TWO_SENTENCES, "response_format": "pcm", "stream_format": stream_format}
                              ) as response:
                assert response.status_code == 200
                for piece in response.iter_bytes():
                    received += piece
        wait_until(lambda: app.state.serve.admitted == 0, what="slot freed")
        again = httpx.post(f"{base_url}/v1/audio/speech", json={**TWO_SENTENCES, "input": "Hi."}, timeout=30)
    assert len(received) > 1000  # the first sentence arrived
    assert b"speech.audio.done" not in received
    cut, refused = errors_logged(server_log)  # one record per request
    assert "speech stream cut" in cut.getMessage() and "RuntimeError: decoder blew up" in cut.getMessage()
    assert cut.exc_info is not None
    assert metric(app, "tts_disconnected_responses_total", reason="synthesis_failed") == 1
    assert again.status_code == 500 and "synthesis_failed" in refused.getMessage()  # the model still fails
    assert not any("ASGI" in record.getMessage() for record in server_log.records)


def test_an_unexpected_error_is_logged_once_and_answered_500(tmp_path, server_log):
    """An error no code path expects (the frontend itself crashing): one log record naming the route,
    a JSON 500, and nothing from uvicorn."""
    app = serve_failing(tmp_path, FailingModel(served_variant("original_onnx").model, fail_from=99, in_frontend=True))
    with running_server(app) as (_, base_url):
        response = httpx.post(f"{base_url}/v1/audio/speech", json=TWO_SENTENCES, timeout=30)
        wait_until(lambda: app.state.serve.admitted == 0, what="slot freed")
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"
    (record,) = errors_logged(server_log)
    assert "POST /v1/audio/speech" in record.getMessage() and "frontend table missing" in record.getMessage()
    assert not any("ASGI" in record.getMessage() for record in server_log.records)
