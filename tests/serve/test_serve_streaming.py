"""Streaming (serve/streaming.py): decoder chunks equal one-shot audio, WAV-then-PCM, SSE deltas.

    python -m pytest -q tests/test_serve_streaming.py
"""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import soundfile
from fastapi.testclient import TestClient

from models.sampling import VitsSampling
from serve.app import create_app
from serve.audio_format import wav_header
from serve.batching import SentenceJob, synthesize_jobs
from serve.streaming import decoder_chunks
from serve_support import serve_settings, served_variant, wait_until

pytestmark = pytest.mark.slow  # loads the real voice

TEXT = "Is it windy today over the hills and far away?"
SEAM_TOLERANCE = 1e-4  # measured: about 1e-6 with 16 context frames; 4 context frames give 0.1


@pytest.fixture(scope="module")
def teacher():
    return served_variant("teacher")


@pytest.fixture(scope="module")
def job(teacher):
    return SentenceJob(teacher.model.text_to_utterances(TEXT)[0].phoneme_ids, VitsSampling(seed=3))


@pytest.mark.parametrize("chunk_frames", [7, 32])
def test_decoder_chunks_equal_one_shot(teacher, job, chunk_frames):
    one_shot = synthesize_jobs(teacher.model, [job], teacher.noise_channels)[0]
    chunks = list(decoder_chunks(teacher.model, job, teacher.noise_channels, chunk_frames, context_frames=16))
    assert len(chunks) > 3  # several windows: the seams are really tested
    assert all(len(chunk) == chunk_frames * 256 for chunk in chunks[:-1])  # joe: 256 samples per frame
    streamed = np.concatenate(chunks)
    assert streamed.shape == one_shot.shape
    seams = np.cumsum([len(chunk) for chunk in chunks[:-1]])
    around_seams = np.concatenate([np.abs(streamed - one_shot)[max(0, s - 512): s + 512] for s in seams])
    assert around_seams.max() < SEAM_TOLERANCE
    assert np.abs(streamed - one_shot).max() < SEAM_TOLERANCE


def test_too_little_context_shows_at_the_seams(teacher, job):
    """The tolerance above means something: without context the seams are audibly wrong."""
    one_shot = synthesize_jobs(teacher.model, [job], teacher.noise_channels)[0]
    streamed = np.concatenate(list(decoder_chunks(teacher.model, job, teacher.noise_channels, 32, context_frames=0)))
    assert np.abs(streamed - one_shot).max() > 100 * SEAM_TOLERANCE


def test_streamed_wav_header_reads_to_the_end():
    samples = (np.sin(np.arange(4000) / 10) * 0.5).astype(np.float32)
    data = wav_header(22050) + (samples * 32767).round().astype("<i2").tobytes()
    decoded, sample_rate_hz = soundfile.read(io.BytesIO(data), dtype="float32")
    assert sample_rate_hz == 22050 and decoded.shape == samples.shape
    assert np.abs(decoded - samples).max() < 1e-4


def _sse_events(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("variant, mode", [("teacher", "decoder_chunks"), ("original_onnx", "sentence")])
def test_http_stream_equals_one_shot_and_sse_carries_the_same_bytes(tmp_path, variant, mode):
    served = served_variant(variant)
    settings = serve_settings(tmp_path, f"serve.source={variant}", f"serve.streaming={mode}",
                              "serve.decoder_chunk_frames=16", "serve.warmup=false")
    body = {"model": variant, "voice": "joe", "input": f"{TEXT} Yes, it is.", "seed": 7}
    with TestClient(create_app(settings, served)) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        with client.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
            pieces = list(response.iter_bytes())
        sse = client.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
        flac = client.post("/v1/audio/speech", json={**body, "response_format": "flac"})
    # Header, then one piece per decoder window (16 frames) or per sentence (2).
    assert len(pieces) > 10 if mode == "decoder_chunks" else len(pieces) == 3
    wav_bytes = b"".join(pieces)
    assert wav_bytes[:44] == wav_header(22050)  # the header leaves first, with the streaming sizes
    streamed = np.frombuffer(wav_bytes[44:], "<i2").astype(np.float32) / 32767
    sequences = served.model.text_to_utterances(body["input"])
    jobs = [SentenceJob(s.phoneme_ids, VitsSampling(seed=7 + k)) for k, s in enumerate(sequences)]
    one_shot = np.concatenate(synthesize_jobs(served.model, jobs, served.noise_channels))
    assert streamed.shape == one_shot.shape
    assert np.abs(streamed - one_shot).max() < 2 / 32767 + SEAM_TOLERANCE  # 16-bit rounding + seams

    events = _sse_events(sse.text)
    assert sse.headers["content-type"].startswith("text/event-stream")
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == len(one_shot)  # samples
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == wav_bytes

    decoded, sample_rate_hz = soundfile.read(io.BytesIO(flac.content), dtype="float32")
    assert flac.headers["content-type"] == "audio/flac" and sample_rate_hz == 22050
    assert np.abs(decoded - streamed).max() < 1e-4
