"""Speaker-embedding cache (serve/speaker_cache.py): LRU, TTL, size cap, Redis, and upload hits.

    python -m pytest -q tests/test_serve_speaker_cache.py
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.speaker_cache import MemorySpeakerCache, RedisSpeakerCache, content_key
from serve_support import serve_settings, served_variant

pytestmark = pytest.mark.slow  # loads the real voice


class FakeClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _embedding(value: float) -> np.ndarray:
    return np.full(256, value, np.float32)


def test_memory_cache_lru_ttl_and_cap():
    clock = FakeClock()
    cache = MemorySpeakerCache(max_entries=2, ttl_s=10, clock=clock)
    cache.put("a", _embedding(1))
    cache.put("b", _embedding(2))
    assert cache.get("a")[0] == 1  # a is now the most recently used
    cache.put("c", _embedding(3))  # over the cap: b, the least recently used, goes
    assert cache.get("b") is None and cache.get("c")[0] == 3 and len(cache) == 2
    clock.now_s = 10.5  # past the TTL
    assert cache.get("a") is None and len(cache) == 0
    assert (cache.hits, cache.misses) == (2, 2)


def test_content_key_is_the_sha256_of_the_bytes():
    assert content_key(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_redis_cache_same_contract():
    fakeredis = pytest.importorskip("fakeredis", reason="fakeredis not installed: `pip install fakeredis`")
    client = fakeredis.FakeRedis()
    cache = RedisSpeakerCache(client, max_entries=2, ttl_s=60)
    cache.put("a", _embedding(1))
    cache.put("b", _embedding(2))
    assert np.array_equal(cache.get("a"), _embedding(1))
    cache.put("c", _embedding(3))  # b is the least recently used
    assert cache.get("b") is None and len(cache) == 2
    assert 0 < client.pttl("tts:speaker:a") <= 60_000  # Redis expires entries itself
    other_worker = RedisSpeakerCache(client, max_entries=2, ttl_s=60)  # a second worker sees the same entries
    assert other_worker.get("c")[0] == 3 and other_worker.hits == 1


@pytest.fixture(scope="module")
def speech_wav() -> bytes:
    """Two seconds of joe at 22.05 kHz, as a client would upload it."""
    served = served_variant("original_onnx")
    from models.interface import SynthesisRequest
    from models.sampling import VitsSampling

    request = SynthesisRequest.from_utterances(served.model.text_to_utterances(
        "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."),
        sampling=VitsSampling(seed=0))
    waveform = np.concatenate([w.numpy() for w in served.model.synthesize(request).waveforms()])
    buffer = io.BytesIO()
    soundfile.write(buffer, waveform * 0.8, 22050, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_reupload_hits_the_cache(tmp_path, speech_wav):
    settings = serve_settings(tmp_path, "serve.warmup=false")
    with TestClient(create_app(settings, served_variant("original_onnx"))) as client:
        first = client.post("/v1/voices", files={"file": ("joe.wav", speech_wav, "audio/wav")}, data={"name": "me"})
        second = client.post("/v1/voices", files={"file": ("again.wav", speech_wav, "audio/wav")})
        metrics = client.get("/metrics").text
        listed = client.get("/v1/voices").json()["data"]
        speech = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": first.json()["id"], "input": "Hi."})
    assert first.status_code == second.status_code == 201
    assert first.json()["embedding_cached"] is False and second.json()["embedding_cached"] is True
    assert first.json()["id"] == second.json()["id"] and first.json()["sha256"] == content_key(speech_wav)
    assert first.json()["usable"] is False and "zero-shot" in first.json()["note"]
    assert 'tts_speaker_cache_lookups_total{result="hit"} 1.0' in metrics
    assert 'tts_speaker_cache_lookups_total{result="miss"} 1.0' in metrics
    assert [voice["kind"] for voice in listed] == ["builtin", "reference"]
    assert speech.status_code == 400
    assert speech.json()["error"]["code"] == "zero_shot_unsupported"
    assert "family piper does not support zero-shot voices" in speech.json()["error"]["message"]


def test_upload_keeps_the_clip_and_its_transcript(tmp_path, speech_wav):
    """The clip (16 kHz mono) and the transcript stay with the voice, for families that speak with it."""
    settings = serve_settings(tmp_path, "serve.warmup=false")
    app = create_app(settings, served_variant("original_onnx"))
    with TestClient(app) as client:
        upload = client.post("/v1/voices", files={"file": ("joe.wav", speech_wav, "audio/wav")},
                             data={"name": "me", "transcript": " The birch canoe slid on the smooth planks. "})
    assert upload.status_code == 201, upload.text
    voice = upload.json()
    assert voice["transcript"] == "The birch canoe slid on the smooth planks."
    clip = app.state.serve.reference_clips[voice["id"]]
    assert clip.transcript == voice["transcript"] and clip.sample_rate_hz == 16_000
    assert clip.waveform.ndim == 1 and abs(clip.waveform.shape[0] / 16_000 - voice["duration_s"]) < 0.01
