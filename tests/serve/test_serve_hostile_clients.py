"""Hostile and careless clients against a real `python -m serve` (original_onnx, loopback), its
deadlines shortened to one second: incomplete requests are cut and their sockets freed within a
bounded time, oversized heads are refused, text with control characters is refused naming the
character, and normal requests keep being served throughout, with no traceback in the server's log.

    python -m pytest -q tests/serve/test_serve_hostile_clients.py
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # the real voice in a real server process: about 50 s to start on 2 loaded CPU cores

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0  # header_read_timeout_s, body_read_timeout_s and keep_alive_timeout_s of the server below
MAX_HEADER_BYTES = 4096
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Bring the red kite."}
PARTIAL_HEAD = b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: appl"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, log path) of `python -m serve` on a free port; stopped with SIGTERM, which must shut it down
    cleanly, and its log must hold no traceback and no ERROR line."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    port = _free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "serve", "serve.source=original_onnx", f"serve.port={port}",
               "serve.length_buckets=[32,96]", "serve.max_batch_size=4", "serve.threads=1",
               f"serve.header_read_timeout_s={DEADLINE_S}", f"serve.body_read_timeout_s={DEADLINE_S}",
               f"serve.keep_alive_timeout_s={DEADLINE_S}", f"serve.max_header_bytes={MAX_HEADER_BYTES}",
               "serve.access_log=false", f"hydra.run.dir={tmp_path / 'hydra'}", f"paths.output_dir={tmp_path / 'out'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline_s = time.monotonic() + 120
        while "ready: original_onnx" not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline_s, "server not ready within 120 s"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", log_path
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then raises the signal it caught again: -SIGTERM, not a crash
        assert process.wait(timeout=60) in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert "Application shutdown complete" in text
    for mark in ("Traceback", "Exception in ASGI application", " ERROR "):
        assert mark not in text, text[-3000:]


def connect(base_url: str) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after ``timeout_s``."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"connection still open after {timeout_s} s; received {data[:200]!r}") from None
    except ConnectionResetError:
        pass
    return data


def parse_response(data: bytes) -> tuple[int, dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def speech_ok(base_url: str) -> bool:
    response = httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=30)
    return response.status_code == 200 and response.content[:4] == b"RIFF"


def counter(base_url: str, sample: str) -> float:
    """The value of ``sample`` (a metric name with its labels) in /metrics; 0 when absent."""
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def rejected(base_url: str, reason: str) -> float:
    return counter(base_url, f'tts_rejected_requests_total{{reason="{reason}"}}')


def trickle(sock: socket.socket, data: bytes, interval_s: float) -> threading.Thread:
    """Send ``data`` one byte every ``interval_s`` from a thread, until the server closes the connection."""
    def run():
        for index in range(len(data)):
            try:
                sock.send(data[index:index + 1])
            except OSError:
                return
            time.sleep(interval_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["partial", "trickled"])
def test_an_unfinished_head_gets_408_within_the_deadline(server, how):
    """Half a head, or a head sent a byte every 0.2 s (each byte would reset an idle timer): 408 one
    deadline after the first byte."""
    base_url, _ = server
    before = rejected(base_url, "header_timeout")
    sock = connect(base_url)
    started_s = time.monotonic()
    if how == "partial":
        sock.sendall(PARTIAL_HEAD)
    else:
        trickle(sock, PARTIAL_HEAD, interval_s=0.2)
    status, error = parse_response(read_until_closed(sock, timeout_s=5))
    waited_s = time.monotonic() - started_s
    sock.close()
    assert status == 408 and error["error"]["code"] == "header_timeout"
    assert "serve.header_read_timeout_s=1" in error["error"]["message"]
    assert DEADLINE_S - 0.1 < waited_s < DEADLINE_S + 2.0
    assert rejected(base_url, "header_timeout") == before + 1


def test_a_connection_that_sends_nothing_is_closed(server):
    base_url, _ = server
    sock = connect(base_url)
    started_s = time.monotonic()
    assert read_until_closed(sock, timeout_s=5) == b""
    assert time.monotonic() - started_s < DEADLINE_S + 2.0
    sock.close()


def _multipart_head(declared_bytes: int) -> bytes:
    return (b"POST /v1/voices HTTP/1.1\r\nHost: test\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
            b"Content-Length: %d\r\n\r\n" % declared_bytes)


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
    + b'{"model": "tts-1", "voice": "alloy", "input": "' + b"a" * 47,  # 95 of 10,000 bytes
    _multipart_head(10_000) + b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    + b"RIFF" + b"\0" * 24,  # 99 bytes of an upload
], ids=["json-95-of-10000", "multipart-99-bytes"])
def test_a_body_that_never_arrives_gets_408_within_the_deadline(server, request_bytes):
    """... and /metrics counts the request under the 408 the client got, not the route's dropped answer."""
    base_url, _ = server
    route = request_bytes.split()[1].decode()
    sample = f'tts_http_requests_total{{method="POST",route="{route}",status="%d"}}'
    before = {status: counter(base_url, sample % status) for status in (400, 408)}
    sock = connect(base_url)
    started_s = time.monotonic()
    sock.sendall(request_bytes)
    status, error = parse_response(read_until_closed(sock, timeout_s=5))
    sock.close()
    assert status == 408 and error["error"]["code"] == "request_timeout"
    assert time.monotonic() - started_s < DEADLINE_S + 2.0
    assert counter(base_url, sample % 408) == before[408] + 1
    assert counter(base_url, sample % 400) == before[400]


def test_an_unread_body_does_not_hold_the_connection(server):
    """A route that answers without reading its body (405 here): the connection closes after the
    answer, though the client keeps trickling the body's bytes (each of which would disarm the
    keep-alive timer)."""
    base_url, _ = server
    sock = connect(base_url)
    sock.sendall(b"POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10000\r\n\r\n{")
    trickle(sock, b"x" * 100, interval_s=0.2)
    data = read_until_closed(sock, timeout_s=DEADLINE_S + 3.0)
    sock.close()
    assert data.startswith(b"HTTP/1.1 405")


@pytest.mark.parametrize("head", [
    b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: " + b"v" * 8000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: test\r\n" + b"".join(b"X-H-%04d: v\r\n" % n for n in range(1000)) + b"\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: " + b"v" * 8000,  # not finished either
], ids=["one-8kb-value", "1000-headers", "8kb-unfinished"])
def test_an_oversized_head_gets_431(server, head):
    base_url, _ = server
    sock = connect(base_url)
    sock.sendall(head)
    status, error = parse_response(read_until_closed(sock, timeout_s=5))
    sock.close()
    assert status == 431 and error["error"]["code"] == "headers_too_large"
    assert f"serve.max_header_bytes={MAX_HEADER_BYTES}" in error["error"]["message"]


def test_a_megabyte_head_is_cut_and_the_server_keeps_serving(server):
    base_url, _ = server
    sock = connect(base_url)
    sender = threading.Thread(target=lambda: _send_ignoring_reset(
        sock, b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: " + b"v" * 1_000_000), daemon=True)
    sender.start()
    read_until_closed(sock, timeout_s=5)  # a 431, or a reset if the unread rest was still arriving
    sender.join(timeout=5)
    sock.close()
    assert speech_ok(base_url)


def _send_ignoring_reset(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_two_hundred_incomplete_requests_free_their_sockets_while_normal_requests_succeed(server):
    """200 sockets at once (silent, half a head, half a body); a normal speech request succeeds
    while they are open, and the server has closed every one of them within a few deadlines."""
    base_url, _ = server
    openings = [b"", PARTIAL_HEAD,
                (b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10000\r\n\r\n{\"model\"")]
    socks = []
    for index in range(200):
        sock = connect(base_url)
        sock.sendall(openings[index % len(openings)])
        socks.append(sock)
    started_s = time.monotonic()
    assert speech_ok(base_url)
    for sock in socks:
        read_until_closed(sock, timeout_s=max(0.1, started_s + 4 * DEADLINE_S + 3 - time.monotonic()))
        sock.close()
    assert speech_ok(base_url)


@pytest.mark.parametrize("text, codepoint, position", [
    ("hi \u0000 there", "U+0000", 3),
    ("Hello\x00world\x07, how are you?", "U+0000", 5),
    ("Pay \u202egnp.exe now.", "U+202E", 4),
])
def test_control_characters_are_refused_naming_them(server, text, codepoint, position):
    base_url, _ = server
    response = httpx.post(f"{base_url}/v1/audio/speech", json={**SPEECH, "input": text}, timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_text" and error["param"] == "input"
    assert codepoint in error["message"] and f"at position {position}" in error["message"]


def test_whitespace_is_normalised_not_cut(server):
    """Tabs and newlines are spaces under the documented rule: the same audio as the single-spaced text."""
    base_url, _ = server
    spoken = [httpx.post(f"{base_url}/v1/audio/speech", json={**SPEECH, "input": text, "response_format": "pcm"},
                         timeout=30) for text in ("Bring the red kite.", "Bring\tthe\n\nred  kite.")]
    assert [response.status_code for response in spoken] == [200, 200]
    assert spoken[0].content == spoken[1].content and len(spoken[0].content) > 10_000
