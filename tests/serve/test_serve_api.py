"""The HTTP API (serve/app.py): bad input, backpressure, timeouts, auth, readiness, shutdown and
the official openai client.

    python -m pytest -q tests/test_serve_api.py
"""
from __future__ import annotations

import dataclasses

import io
import threading

import httpx
import numpy as np
import pytest
import soundfile
from fastapi.testclient import TestClient

from serve.app import create_app
from serve_support import gated, running_server, serve_settings, served_variant, wait_until

pytestmark = pytest.mark.slow  # loads the real voice

SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Bring the red kite."}


@pytest.fixture(scope="module")
def onnx_served():
    return served_variant("original_onnx")


@pytest.fixture(scope="module")
def client(tmp_path_factory, onnx_served):
    settings = serve_settings(tmp_path_factory.mktemp("api"), "serve.warmup=false", "serve.max_input_chars=600",
                              "serve.max_sentence_chars=80", "serve.max_upload_bytes=400000",
                              "serve.max_upload_s=5", "serve.min_upload_s=1")
    with TestClient(create_app(settings, onnx_served)) as test_client:
        wait_until(lambda: test_client.get("/readyz").status_code == 200, what="ready")
        yield test_client


def _wav(waveform: np.ndarray, sample_rate_hz: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, waveform, sample_rate_hz, format="WAV", subtype=subtype)
    return buffer.getvalue()


def _speechlike(seconds: float, sample_rate_hz: int, level: float = 0.3) -> np.ndarray:
    """A vowel-like harmonic tone with a syllable envelope: decodes as audio, not silence, not clipped."""
    t = np.arange(int(seconds * sample_rate_hz)) / sample_rate_hz
    tone = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    return (level * tone * envelope / np.abs(tone).max()).astype(np.float32)


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    return error


# ---------------------------------------------------------------- speech: bad input

@pytest.mark.parametrize("change, status, code", [
    ({"voice": "nobody"}, 400, "unknown_voice"),
    ({"voice": "/etc/passwd"}, 400, "path_not_allowed"),
    ({"voice": "..\\voices\\joe.onnx"}, 400, "path_not_allowed"),
    ({"model": "/models/joe.onnx"}, 400, "path_not_allowed"),
    ({"model": "whisper-1"}, 404, "model_not_found"),
    ({"speed": 0.1}, 400, "invalid_value"),
    ({"speed": 5}, 400, "invalid_value"),
    ({"speed": "fast"}, 400, "invalid_value"),
    ({"response_format": "mp3"}, 400, "invalid_value"),
    ({"response_format": "flac", "stream_format": "sse"}, 400, "unsupported_format"),
    ({"input": ""}, 400, "invalid_value"),
    ({"input": "x" * 601}, 400, "input_too_long"),
    ({"input": "... !!!"}, 400, "unspeakable_text"),
    ({"emotion": "happy"}, 400, "unsupported_parameter"),
    ({"instructions": "Speak cheerfully."}, 400, "unsupported_parameter"),
    ({"noise_scale": -1}, 400, "invalid_value"),
    ({"seed": -3}, 400, "invalid_value"),
    ({"file_path": "/tmp/x.wav"}, 400, "unknown_parameter"),
    ({"input": None}, 400, "invalid_value"),
])
def test_bad_speech_requests_get_json_4xx(client, change, status, code):
    _error(client.post("/v1/audio/speech", json={**SPEECH, **change}), status, code)


def test_missing_field_and_bad_json(client):
    _error(client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "joe"}), 400, "missing_parameter")
    _error(client.post("/v1/audio/speech", content=b'{"model": "tts-1",', headers={"content-type": "application/json"}),
           400, "invalid_json")
    _error(client.get("/v1/no-such-route"), 404, "not_found")


def test_voice_object_and_fields_accepted(client):
    response = client.post("/v1/audio/speech", json={**SPEECH, "voice": {"id": "joe"}, "noise_scale": 0,
                                                     "noise_scale_w": 0, "seed": 1, "speed": 2.0})
    fast = np.frombuffer(response.content[44:], "<i2")
    slow = np.frombuffer(client.post("/v1/audio/speech", json={**SPEECH, "speed": 0.5}).content[44:], "<i2")
    assert response.status_code == 200 and 3 < len(slow) / len(fast) < 5  # length_scale = 1 / speed


def test_too_long_sentence_is_split_not_rejected(client):
    long_sentence = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)  # 351 chars, no punctuation
    before = _batch_sentences(client)
    response = client.post("/v1/audio/speech", json={**SPEECH, "input": long_sentence, "response_format": "pcm"})
    assert response.status_code == 200
    assert _batch_sentences(client) - before >= 5  # at most 80 chars per piece: at least 5 pieces
    assert len(response.content) / 2 / 22050 > 10  # all of it was spoken: over 10 s of audio


def _batch_sentences(client) -> float:
    metrics = client.get("/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("tts_batch_size_sum")))


# ---------------------------------------------------------------- uploads: bad input

def _upload(client, data: bytes, filename: str = "clip.wav"):
    return client.post("/v1/voices", files={"file": (filename, data, "audio/wav")})


@pytest.mark.parametrize("make, status, code", [
    (lambda: b"this is not audio at all " * 40, 400, "invalid_audio"),
    (lambda: b"", 400, "empty_audio"),
    (lambda: _wav(np.zeros(0, np.float32), 16000), 400, "empty_audio"),
    (lambda: _wav(np.zeros(32000, np.float32), 16000), 400, "silent_audio"),
    (lambda: _wav(np.clip(_speechlike(2, 16000) * 10, -1, 1), 16000), 400, "clipped_audio"),
    (lambda: _wav(_speechlike(6, 16000), 16000), 400, "audio_too_long"),
    (lambda: _wav(_speechlike(0.3, 16000), 16000), 400, "audio_too_short"),
    (lambda: _wav(_speechlike(2, 8000), 8000), 400, "unsupported_sample_rate"),
    (lambda: _wav(_speechlike(2, 96000), 96000), 400, "unsupported_sample_rate"),
    (lambda: _wav(_speechlike(4.9, 44100), 44100, "FLOAT"), 413, "upload_too_large"),
])
def test_bad_uploads_get_json_4xx(client, make, status, code):
    _error(_upload(client, make()), status, code)


def test_uploads_without_the_speaker_encoder_answer_501_and_speech_still_works(client, monkeypatch):
    """A serving machine without resemblyzer/librosa (the GPU image): uploads say what is missing."""
    import serve.voices

    def missing():
        raise ModuleNotFoundError("No module named 'librosa'", name="librosa")

    monkeypatch.setattr(serve.voices, "_speaker_encoder", missing)
    error = _error(_upload(client, _wav(_speechlike(2, 16000), 16000)), 501, "voice_upload_unavailable")
    assert "'librosa'" in error["message"]
    assert client.post("/v1/audio/speech", json=SPEECH).status_code == 200


def test_acceptable_rate_is_resampled(client):
    response = _upload(client, _wav(_speechlike(2, 44100), 44100))
    assert response.status_code == 201, response.text
    assert response.json()["sample_rate_hz"] == 44100 and response.json()["duration_s"] == pytest.approx(2.0)


def test_uploads_take_bytes_never_paths(client):
    _error(client.post("/v1/voices", data={"file": "/etc/passwd"}), 400, "invalid_upload")
    _error(client.post("/v1/voices", json={"file": "/home/me/voice.wav"}), 400, "invalid_upload")


# ---------------------------------------------------------------- backpressure, timeout, readiness, auth

def test_full_queue_answers_503_with_retry_after(tmp_path, onnx_served):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.queue_capacity=1")
    app = create_app(settings, served)
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(r=client.post("/v1/audio/speech", json=SPEECH)))
        first.start()
        wait_until(lambda: model.calls == 1, what="first request running")
        refused = client.post("/v1/audio/speech", json=SPEECH)
        model.gate.set()
        first.join()
        after = client.post("/v1/audio/speech", json=SPEECH)
        metrics = client.get("/metrics").text
    _error(refused, 503, "queue_full")
    assert refused.headers["retry-after"] == "1"
    assert held["r"].status_code == 200 and after.status_code == 200  # the queue frees up again
    assert 'tts_rejected_requests_total{reason="queue_full"} 1.0' in metrics


def test_first_audio_timeout_answers_504_and_frees_the_slot(tmp_path, onnx_served):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.first_audio_timeout_s=2", "serve.queue_capacity=1")
    with TestClient(create_app(settings, served)) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        timed_out = client.post("/v1/audio/speech", json=SPEECH)
        model.gate.set()
        wait_until(lambda: client.app.state.serve.admitted == 0, what="slot freed")
        later = client.post("/v1/audio/speech", json=SPEECH)
    _error(timed_out, 504, "first_audio_timeout")
    assert later.status_code == 200


def test_ready_only_after_warm_up(tmp_path, onnx_served):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=true")
    with TestClient(create_app(settings, served)) as client:
        assert client.get("/healthz").status_code == 200  # alive while warming up
        not_ready = client.get("/readyz")
        early = client.post("/v1/audio/speech", json=SPEECH)
        model.gate.set()
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
    _error(not_ready, 503, "warming_up")
    _error(early, 503, "warming_up")
    assert model.calls == 2  # one batch per length bucket ([32, 96])


def test_worker_warms_up_before_it_accepts_requests(tmp_path, onnx_served):
    """Workers sharing a port (serve.workers > 1) warm up inside start-up: the first request any
    client gets through is served, and readiness holds from the start."""
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=true")
    threading.Timer(0.5, model.gate.set).start()  # start-up blocks on the gated warm-up until then
    with TestClient(create_app(settings, served, warm_up_before_serving=True)) as client:
        assert model.calls == 2  # both length buckets ([32, 96]) ran before the app took a request
        ready = client.get("/readyz")
        first = client.post("/v1/audio/speech", json=SPEECH)
    assert ready.status_code == 200 and first.status_code == 200


def test_bucketed_engines_warm_every_text_bucket_batch_bucket_and_pace(tmp_path, onnx_served):
    """A bucketed engine on a GPU captures per (batch, text, frame) bucket: its warm-up covers each of
    its own text buckets up to the longest length bucket, at every batch bucket, at three paces, but
    only the batches serve.max_batch_phonemes lets the batcher form."""
    from models.piper.engines import TEXT_BUCKETS, text_bucket
    from serve.speech import warmup_batches

    settings = serve_settings(tmp_path, "serve.length_buckets=[512]", "serve.max_batch_size=8",
                              "serve.max_batch_phonemes=2048")
    WARMUP_LENGTH_SCALES = settings.warmup_length_scales
    assert WARMUP_LENGTH_SCALES == (0.8, 1.0, 1.25)  # the configured paces, slower and faster than the voice's
    onnx_batches = warmup_batches(onnx_served, settings)
    assert [(len(batch), len(batch[0].phoneme_ids)) for batch in onnx_batches] == [(4, 512)]  # 4 x 512 = 2048
    bucketed = dataclasses.replace(onnx_served, engine="torch_cuda_graphs", noise_device="cuda",
                                   captures_graphs=True, text_buckets=TEXT_BUCKETS)
    ordered = [(len(batch), text_bucket(len(batch[0].phoneme_ids)), batch[0].sampling.length_scale)
               for batch in warmup_batches(bucketed, settings)]
    # Largest first, so the first capture sizes the graphs' memory pool for all the others.
    assert ordered[0] == (2, 512, max(WARMUP_LENGTH_SCALES)) and ordered[-1] == (1, 32, min(WARMUP_LENGTH_SCALES))
    shapes = set(ordered)
    assert len(shapes) == len(ordered)
    assert shapes == {(size, bound, scale) for size in (1, 2, 4, 8) for bound in TEXT_BUCKETS if bound <= 512
                      for scale in WARMUP_LENGTH_SCALES if size == 1 or size * bound * scale <= 2048}
    assert (8, 256, 1.0) in shapes and (8, 256, 1.25) not in shapes
    no_graphs = dataclasses.replace(onnx_served, engine="torch_aoti", text_buckets=TEXT_BUCKETS)  # nothing captured: one pass per batch size
    assert [(len(batch), len(batch[0].phoneme_ids)) for batch in warmup_batches(no_graphs, settings)] == \
        [(1, 512), (2, 512), (4, 512)]
    own_pace = dataclasses.replace(settings, warmup_length_scales=(1.0,))  # clients that never set speed
    assert {batch[0].sampling.length_scale for batch in warmup_batches(bucketed, own_pace)} == {1.0}


def test_engines_that_split_by_length_warm_spread_lengths_too(tmp_path, onnx_served):
    """An engine running a batch in length groups meets a frame bucket per group: each warm-up batch of 2 or
    more rows comes again with lengths spread up to its text bucket's bound, in the same text bucket."""
    from models.piper.engines import TEXT_BUCKETS, text_bucket
    from serve.speech import warmup_batches

    settings = serve_settings(tmp_path, "serve.length_buckets=[512]", "serve.max_batch_size=8",
                              "serve.max_batch_phonemes=2048", "serve.warmup_length_scales=[1.0]")
    bucketed = dataclasses.replace(onnx_served, engine="torch_cuda_graphs", noise_device="cuda",
                                   captures_graphs=True, text_buckets=TEXT_BUCKETS)
    equal = warmup_batches(bucketed, settings)
    split = warmup_batches(dataclasses.replace(bucketed, splits_by_length=True), settings)
    spread = [batch for batch in split if len({len(job.phoneme_ids) for job in batch}) > 1]
    assert [batch for batch in split if batch not in spread] == equal
    assert len(spread) == sum(len(batch) >= 2 for batch in equal)
    for batch in spread:
        lengths = [len(job.phoneme_ids) for job in batch]
        bound = text_bucket(max(lengths))
        assert max(lengths) == bound and lengths == sorted(lengths) and min(lengths) <= bound // len(batch) + 1
        assert [len(other) for other in equal if text_bucket(len(other[0].phoneme_ids)) == bound].count(len(batch)) == 1


def test_bearer_token(tmp_path, onnx_served, monkeypatch):
    monkeypatch.setenv("TTS_SERVE_API_KEY", "s3cret-token")
    settings = serve_settings(tmp_path, "serve.warmup=false")
    with TestClient(create_app(settings, onnx_served)) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        missing = client.post("/v1/audio/speech", json=SPEECH)
        wrong = client.get("/v1/voices", headers={"Authorization": "Bearer nope-nope"})
        right = client.get("/v1/voices", headers={"Authorization": "Bearer s3cret-token"})
        open_routes = [client.get(path).status_code for path in ("/healthz", "/readyz", "/metrics")]
    assert _error(missing, 401, "invalid_api_key") and missing.headers["www-authenticate"] == "Bearer"
    _error(wrong, 401, "invalid_api_key")
    assert right.status_code == 200 and open_routes == [200, 200, 200]


# ---------------------------------------------------------------- real server: openai client, shutdown

def test_openai_client_works_unchanged(tmp_path, onnx_served):
    openai = pytest.importorskip("openai", reason="`pip install openai` to test the official client")
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.api_key=test-token-123")
    with running_server(create_app(settings, onnx_served)) as (_, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="test-token-123")
        response = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello from the server.")
        waveform, sample_rate_hz = soundfile.read(io.BytesIO(response.content))
        with pytest.raises(openai.BadRequestError) as bad_voice:
            client.audio.speech.create(model="tts-1", voice="nobody", input="Hello.")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong-key").audio.speech.create(
                model="tts-1", voice="alloy", input="Hello.")
    assert sample_rate_hz == 22050 and 0.8 < len(waveform) / sample_rate_hz < 5
    assert bad_voice.value.code == "unknown_voice"  # the client parses our error body as OpenAI's


def test_graceful_shutdown_finishes_in_flight_requests(tmp_path, onnx_served):
    served, model = gated(onnx_served)
    settings = serve_settings(tmp_path, "serve.warmup=false")
    app = create_app(settings, served)
    with running_server(app) as (server, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        result: dict = {}
        request = threading.Thread(target=lambda: result.update(
            r=httpx.post(f"{base_url}/v1/audio/speech", json=SPEECH, timeout=30)))
        request.start()
        wait_until(lambda: model.calls == 1, what="request running")
        server.should_exit = True  # what SIGTERM does
        threading.Timer(0.5, model.gate.set).start()
        request.join(timeout=30)
    assert result["r"].status_code == 200
    waveform, _ = soundfile.read(io.BytesIO(result["r"].content))
    assert len(waveform) > 10_000
