"""PyTriton serving: audio equal to PiperOnnxRuntimeVoice for the same seed, and concurrent requests batched.

PyTriton needs numpy<2, so it lives in .venv-pytriton (scripts/pytriton_env.sh). Run there:

    .venv-pytriton/bin/python -m pytest tests/serve/test_pytriton_server.py -q

From the main environment, ``test_in_pytriton_venv`` runs this file in that venv when it exists.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # loads the real voice

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PYTRITON_PYTHON = Path(os.environ.get("PYTRITON_PYTHON", REPO_ROOT / ".venv-pytriton" / "bin" / "python"))
IN_PYTRITON_ENV = all(importlib.util.find_spec(name) is not None for name in ("pytriton", "tritonclient"))

needs_pytriton = pytest.mark.skipif(not IN_PYTRITON_ENV, reason="runs inside .venv-pytriton (see the module docstring)")
QUEUE_DELAY_US = 300_000  # long enough that requests sent together always meet in one batch


@pytest.mark.skipif(IN_PYTRITON_ENV, reason="already in the PyTriton venv: the tests below run directly")
@pytest.mark.skipif(not PYTRITON_PYTHON.is_file(), reason=(
    "no PyTriton venv: PyTriton needs numpy<2, which the main environment cannot take; "
    "build it with `bash scripts/pytriton_env.sh` (or set PYTRITON_PYTHON)"))
def test_in_pytriton_venv():
    result = subprocess.run([str(PYTRITON_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout.strip().splitlines()[-1], result.stdout[-2000:]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def server_url():
    """python -m serve.pytriton_server on free loopback ports; stopped (SIGINT, then kill) at the end."""
    http_port, grpc_port, metrics_port = _free_ports(3)
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"pytriton_test_{http_port}.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "serve.pytriton_server", "--variant", "original_onnx", "--threads", "1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
         "--max-batch-size", "8", "--max-queue-delay-us", str(QUEUE_DELAY_US)],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        url = f"127.0.0.1:{http_port}"
        asyncio.run(_wait_ready(url, process, log.name))
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # PyTriton stops tritonserver and its stubs on SIGINT
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        log.close()


async def _wait_ready(url: str, process: subprocess.Popen, log_path: str, timeout_s: float = 60.0) -> None:
    import tritonclient.http.aio as triton_http

    client = triton_http.InferenceServerClient(url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"pytriton_server exited with {process.returncode}; see {log_path}")
            try:
                if await client.is_model_ready("tts"):
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            await asyncio.sleep(0.5)
        raise TimeoutError(f"pytriton_server not ready after {timeout_s} s; see {log_path}")
    finally:
        await client.close()


async def _speak_all(url: str, texts_and_seeds: list[tuple[str, int]]) -> list[tuple[np.ndarray, int]]:
    """All requests at once; (audio, batch_size) per request, in order."""
    import tritonclient.http as triton_http
    import tritonclient.http.aio as triton_http_aio

    client = triton_http_aio.InferenceServerClient(url)

    async def speak(text: str, seed: int):
        text_input = triton_http.InferInput("text", [1, 1], "BYTES")
        text_input.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=object))
        seed_input = triton_http.InferInput("seed", [1, 1], "INT64")
        seed_input.set_data_from_numpy(np.array([[seed]], dtype=np.int64))
        result = await client.infer("tts", [text_input, seed_input])
        length = int(result.as_numpy("audio_length")[0, 0])
        return result.as_numpy("audio")[0, :length], int(result.as_numpy("batch_size")[0, 0])

    try:
        return list(await asyncio.gather(*(speak(text, seed) for text, seed in texts_and_seeds)))
    finally:
        await client.close()


def _reference(voice, text: str, seed: int) -> np.ndarray:
    from models.interface import SynthesisRequest
    from models.sampling import VitsSampling

    result = voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances(text),
                                                              sampling=VitsSampling(seed=seed)))
    return np.concatenate([waveform.numpy() for waveform in result.waveforms()])


@pytest.fixture(scope="module")
def voice():
    from models.piper.onnx_runtime import PiperOnnxRuntimeVoice

    return PiperOnnxRuntimeVoice("bundled:joe", threads=1)


@needs_pytriton
def test_single_request_equals_onnx_runtime_voice(server_url, voice):
    text = "Quiet rivers rarely argue with the moon. Where did Kenji leave his lantern?"
    ((audio, batch_size),) = asyncio.run(_speak_all(server_url, [(text, 7)]))
    reference = _reference(voice, text, 7)
    assert batch_size == 1
    assert audio.shape == reference.shape  # both sentences, one after the other
    np.testing.assert_allclose(audio, reference, atol=1e-5)


@needs_pytriton
def test_concurrent_requests_are_batched_and_keep_their_noise(server_url, voice):
    """Four requests sent together run as one batch; each keeps its own seed's audio.

    Batched with longer rows, a request's audio moves by ~1e-4 (onnxruntime's kernels see other
    shapes and padding: about -70 dB under the speech); durations, so lengths, stay exact.
    """
    requests = [("The harbour lights came on one by one.", 1), ("Please close the garden gate tonight.", 2),
                ("Seven small boats drifted past the old pier.", 3), ("The harbour lights came on one by one.", 4)]
    results = asyncio.run(_speak_all(server_url, requests))
    assert max(batch for _, batch in results) >= 2, [batch for _, batch in results]
    for (text, seed), (audio, _) in zip(requests, results):
        reference = _reference(voice, text, seed)
        assert audio.shape == reference.shape, (text, seed)
        np.testing.assert_allclose(audio, reference, atol=5e-4)
    same_text = min(len(results[0][0]), len(results[3][0]))
    assert np.abs(results[0][0][:same_text] - results[3][0][:same_text]).max() > 1e-2  # same text, other seed


@needs_pytriton
def test_loadtest_triton_mode(server_url, tmp_path):
    from serve.loadtest import main

    report = main(["--triton", "--url", f"http://{server_url}", "--concurrency", "4", "--requests", "8",
                   "--max-seconds", "60", "--warmup", "0", "--out", str(tmp_path / "r.json"), "--no-table"])
    (level,) = report["levels"]
    assert report["mode"] == "triton" and level["requests_ok"] == 8 and level["errors_by_status"] == {}
    assert level["observed_batch_size"]["max"] >= 2  # four in flight meet in Triton's batcher
    assert level["latency_ms"]["p50"] > 0 and level["audio_bytes_total"] > 8 * 22050 * 4  # > 1 s each, float32
