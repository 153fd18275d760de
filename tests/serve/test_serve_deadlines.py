"""Hostile and careless clients against a real uvicorn on loopback: admission counts work, not
sockets; slow readers, stalled and oversized bodies and late audio end with one log line each.

    python -m pytest -q tests/serve/test_serve_deadlines.py
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import threading
import time

import httpx
import pytest
from serve_support import (
    ToneModel,
    gated,
    running_server,
    serve_settings,
    served_variant,
    wait_until,
)

from serve.app import create_app
from serve.client_limits import ClientConnection
from serve.streaming import PacedAudioResponse

SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Bring the red kite."}
# 120 sentences of 1.5 s (LongAudioModel): 10 MB of SSE, well past what loopback's kernel buffers
# take from a client that never reads (2.8 MB measured), in short chunks, so such a client is
# dropped soon after the grace.
LONG_SPEECH = {**SPEECH, "input": " ".join(["Go now."] * 120), "stream_format": "sse"}


@pytest.fixture(scope="module")
def onnx_served():
    return served_variant("original_onnx")


def assert_no_traceback(caplog) -> None:
    bad = [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert not bad, [record.getMessage() for record in bad]


def metric(app, name: str, **labels) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels) or 0.0


def open_request(base_url: str, head: str, body: bytes = b"", receive_buffer_bytes: int | None = None) -> socket.socket:
    """A raw connection that sent ``head`` (request line and headers, without the blank line) and ``body``."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer_bytes is not None:  # before connect: the window the client advertises
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    sock.connect((host, int(port)))
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
    return sock


def json_post(path: str, body: dict) -> tuple[str, bytes]:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\nHost: test\nContent-Type: application/json\nContent-Length: {len(data)}", data)


def read_response(sock: socket.socket, timeout_s: float) -> tuple[int, dict]:
    """(status, JSON body) of a response the server ends by closing (Connection: close)."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_never_reading_clients_hold_no_slot_and_are_dropped(tmp_path, onnx_served, server_log):
    """queue_capacity non-readers: once their audio is made their slots are free (a normal request
    gets 200 while they are still connected), and each is dropped after the grace, counted."""
    capacity = 2
    settings = serve_settings(tmp_path, "serve.warmup=false", f"serve.queue_capacity={capacity}",
                              f"serve.max_requests_per_client={capacity}", "serve.slow_client_grace_s=2")
    app = create_app(settings, dataclasses.replace(onnx_served, model=ToneModel(onnx_served.model, 1.5)))
    with running_server(app) as (_, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        head, body = json_post("/v1/audio/speech", LONG_SPEECH)
        readers = [open_request(base_url, head, body, receive_buffer_bytes=4096) for _ in range(capacity)]
        wait_until(lambda: metric(app, "tts_time_to_first_audio_seconds_count") == capacity, timeout_s=10,
                   what="both admitted")
        wait_until(lambda: app.state.serve.admitted == 0, timeout_s=10, what="their synthesis done")
        assert metric(app, "tts_disconnected_responses_total", reason="slow_reader") == 0  # still connected
        served = httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=10)
        assert served.status_code == 200
        wait_until(lambda: metric(app, "tts_disconnected_responses_total", reason="slow_reader") == capacity,
                   timeout_s=10, what="slow readers dropped")
        for sock in readers:  # the server closed them: what the kernel held, then the end
            sock.settimeout(5)
            with pytest.raises((ConnectionResetError, AssertionError)):
                while sock.recv(65536):
                    pass
                raise AssertionError("closed")
            sock.close()
        metrics = httpx.get(f"{base_url}/metrics").text
    assert 'tts_disconnected_responses_total{reason="slow_reader"} 2.0' in metrics
    assert sum("slow reader disconnected" in record.getMessage() for record in server_log.records) == capacity
    assert_no_traceback(server_log)


def test_a_client_past_its_limit_gets_429(tmp_path, onnx_served, server_log):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.max_requests_per_client=1")
    app = create_app(settings, served)
    with running_server(app) as (_, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(
            response=httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=20)))
        first.start()
        wait_until(lambda: model.calls == 1, what="first request in synthesis")
        refused = httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=10)
        model.gate.set()
        first.join()
        after = httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=10)
        metrics = httpx.get(f"{base_url}/metrics").text
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "too_many_requests"
    assert held["response"].status_code == 200 and after.status_code == 200
    assert 'tts_rejected_requests_total{reason="too_many_requests"} 1.0' in metrics
    assert_no_traceback(server_log)


MULTIPART_HEAD = ("POST /v1/voices HTTP/1.1\nHost: test\nContent-Type: multipart/form-data; boundary=XyZ\n"
                  "Content-Length: 10000")
MULTIPART_START = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'


@pytest.mark.parametrize("head, body", [
    ("POST /v1/audio/speech HTTP/1.1\nHost: test\nContent-Type: application/json\nContent-Length: 10000",
     b'{"model": "tts-1", "voice": "alloy", "input": "' + b"a" * 48),
    ("POST /v1/audio/speech HTTP/1.1\nHost: test\nContent-Type: application/json\nTransfer-Encoding: chunked",
     b'11\r\n{"model": "tts-1"\r\n'),
    (MULTIPART_HEAD, MULTIPART_START),
], ids=["json", "json-chunked", "multipart"])
def test_a_stalled_body_gets_408_within_the_deadline(tmp_path, onnx_served, server_log, head, body):
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.body_read_timeout_s=1")
    app = create_app(settings, onnx_served)
    with running_server(app) as (_, base_url):
        started_s = time.monotonic()
        sock = open_request(base_url, head, body)
        status, error = read_response(sock, timeout_s=5)
        waited_s = time.monotonic() - started_s
        sock.close()
    assert status == 408 and error["error"]["code"] == "request_timeout"
    assert 0.9 < waited_s < 3.0
    assert metric(app, "tts_rejected_requests_total", reason="request_timeout") == 1
    assert_no_traceback(server_log)


@pytest.mark.parametrize("head, body, code", [
    ("POST /v1/audio/speech HTTP/1.1\nHost: test\nContent-Type: application/json\nContent-Length: 5000000",
     b'{"model": "tts-1"', "body_too_large"),
    ("POST /v1/audio/speech HTTP/1.1\nHost: test\nContent-Type: application/json\nTransfer-Encoding: chunked",
     b"".join(b"400\r\n" + b"a" * 1024 + b"\r\n" for _ in range(4)), "body_too_large"),
    (MULTIPART_HEAD.replace("10000", "50000000"), MULTIPART_START, "upload_too_large"),
], ids=["json-declared", "json-chunked", "multipart-declared"])
def test_an_oversized_body_gets_413_without_being_read(tmp_path, onnx_served, server_log, head, body, code):
    """The declared ones answer before the body is sent; the chunked one as soon as it passes the cap
    (2000 bytes here), with the rest of its stream never sent."""
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.max_body_bytes=2000",
                              "serve.body_read_timeout_s=10")
    app = create_app(settings, onnx_served)
    with running_server(app) as (_, base_url):
        started_s = time.monotonic()
        sock = open_request(base_url, head, body)
        status, error = read_response(sock, timeout_s=5)
        sock.close()
    assert status == 413 and error["error"]["code"] == code
    assert time.monotonic() - started_s < 3.0  # not the body-read deadline
    assert metric(app, "tts_rejected_requests_total", reason=code) == 1
    assert_no_traceback(server_log)


def test_no_first_audio_in_time_answers_504(tmp_path, onnx_served, server_log):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.first_audio_timeout_s=1")
    app = create_app(settings, served)
    with running_server(app) as (_, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        started_s = time.monotonic()
        timed_out = httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=10)
        waited_s = time.monotonic() - started_s
        model.gate.set()
        wait_until(lambda: app.state.serve.admitted == 0, what="slot freed")
    assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "first_audio_timeout"
    assert waited_s < 3.0
    assert metric(app, "tts_rejected_requests_total", reason="first_audio_timeout") == 1
    assert_no_traceback(server_log)


class SlowAfterFirstModel:
    """Synthesizes its first batch at once and every later one after ``delay_s``."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s, self.calls = inner, delay_s, 0
        self.sample_rate_hz = inner.sample_rate_hz

    def text_to_utterances(self, text):
        return self.inner.text_to_utterances(text)

    def synthesize(self, request):
        self.calls += 1
        if self.calls > 1:
            time.sleep(self.delay_s)
        return self.inner.synthesize(request)


def test_a_stream_past_its_total_deadline_ends_without_its_final_chunk(tmp_path, onnx_served, server_log):
    served = dataclasses.replace(onnx_served, model=SlowAfterFirstModel(onnx_served.model, delay_s=2.5))
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.max_batch_size=1",
                              "serve.first_audio_timeout_s=1", "serve.total_timeout_s=1.5")
    app = create_app(settings, served)
    body = {**SPEECH, "input": "Bring the red kite. Then fly it over the hill.", "response_format": "pcm"}
    with running_server(app) as (_, base_url):
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never ends
            with httpx.stream("POST", f"{base_url}/v1/audio/speech", json=body, timeout=10) as response:
                assert response.status_code == 200
                for piece in response.iter_bytes():
                    received += piece
        wait_until(lambda: app.state.serve.admitted == 0, what="slot freed")
    assert len(received) > 0  # the first sentence arrived
    assert metric(app, "tts_disconnected_responses_total", reason="total_timeout") == 1
    assert sum("speech stream cut" in record.getMessage() for record in server_log.records) == 1
    assert_no_traceback(server_log)


@pytest.mark.parametrize("override, message", [
    ("serve.slow_client_grace_s=0", "serve.slow_client_grace_s=0"),
    ("serve.body_read_timeout_s=soon", "serve.body_read_timeout_s='soon'"),
    ("serve.max_requests_per_client=0", "serve.max_requests_per_client=0"),
    ("serve.max_body_bytes=1.5", "serve.max_body_bytes=1.5"),
    ("serve.first_audio_timeout_s=300", "must be <= total_timeout_s"),
    ("+serve.request_timeout_s=30", r"unknown keys \['request_timeout_s'\]"),
])
def test_bad_client_limits_fail_at_start_naming_the_key(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        serve_settings(tmp_path, override)


@pytest.mark.parametrize("read_speed, dropped", [(1.0, False), (0.5, True)])
def test_pacing_drops_only_a_client_behind_real_time(read_speed, dropped):
    """Ten chunks of 0.1 s of audio; the client's ``send`` takes as long as it reads them at ``read_speed``
    x real time. A real-time player is never behind; a half-speed reader falls 0.1 s further behind
    with each chunk and passes the 0.35 s grace on the fourth."""
    bytes_per_audio_s = 1000.0
    drops, bodies = [], []

    async def chunks():
        for _ in range(10):
            yield b"x" * 100  # 0.1 s of audio

    async def send(message):
        if message["type"] == "http.response.body" and message["body"]:
            await asyncio.sleep(len(message["body"]) / bytes_per_audio_s / read_speed)
        bodies.append(message)

    response = PacedAudioResponse(chunks(), connection=ClientConnection(None), bytes_per_audio_s=bytes_per_audio_s,
                                  grace_s=0.35, on_slow_reader=lambda: drops.append(1), media_type="audio/pcm",
                                  headers={})
    asyncio.run(response.stream_response(send))
    sent = [message for message in bodies if message["type"] == "http.response.body" and message["body"]]
    if dropped:
        assert drops == [1] and len(sent) == 3 and bodies[-1]["more_body"]  # no final chunk
    else:
        assert drops == [] and len(sent) == 10 and not bodies[-1]["more_body"]
