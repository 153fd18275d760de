"""The API follows the served family's capabilities (models/interface.py), not its name: style prompts
reach families with prompt_style, uploaded clips reach zero-shot families, sampling options are the
family's, and an autoregressive model without a token-step decoder is refused at start.

    python -m pytest -q tests/serve/test_serve_capabilities.py
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
import torch
from fastapi.testclient import TestClient

from models.family import Family
from models.interface import Capabilities, SynthesisRequest, SynthesisResult, Utterance
from models.sampling import AutoregressiveSampling, Sampling, VitsSampling
from serve.app import create_app
from serve.batching import SchedulerUnavailableError
from serve.engines import ServedModel
from serve_support import serve_settings, served_variant, wait_until

SAMPLE_RATE_HZ = 16_000
SAMPLES_PER_ID = 160  # 10 ms of audio per phoneme id


class RecordingModel:
    """A TTSModel of a made-up family: one id per character, silence, and every request kept."""

    sample_rate_hz = SAMPLE_RATE_HZ

    def __init__(self, family: str, capabilities: Capabilities, sampling_type: type[Sampling]):
        self.family, self.capabilities, self.sampling_type = family, capabilities, sampling_type
        self.requests: list[SynthesisRequest] = []

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return [Utterance(text, tuple(text), tuple(1 + ord(c) % 50 for c in text))]

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.capabilities.check(request.voice, self.family)
        self.requests.append(request)
        audio_lengths = request.phoneme_lengths * SAMPLES_PER_ID  # (B,)
        audio = torch.zeros(len(audio_lengths), int(audio_lengths.max()))  # (B, T_audio)
        return SynthesisResult(audio, audio_lengths, SAMPLE_RATE_HZ)

    def parts(self) -> dict:
        return {}

    def replace_part(self, role, module) -> None:
        raise NotImplementedError(f"{self.family} has no replaceable parts")


def _served(name: str, capabilities: Capabilities, sampling_type: type[Sampling] = Sampling,
            noise_channels: int | None = None) -> ServedModel:
    model = RecordingModel(name, capabilities, sampling_type)
    family = Family(name=name, capabilities=capabilities, sampling_type=sampling_type, part_roles=(),
                    load_teacher=lambda voice, cache_dir: model, tiny_model=lambda seed: model,
                    default_voice="narrator")
    return ServedModel(model, f"{name}-variant", family, "torch", "narrator", noise_channels)


def _speech(client: TestClient, **fields):
    return client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "Hello there.",
                                                 "response_format": "pcm", **fields})


@pytest.fixture
def app_of(tmp_path):
    """A started app over a ServedModel; yields (client, model)."""
    clients = []

    def start(served: ServedModel):
        client = TestClient(create_app(serve_settings(tmp_path, "serve.warmup=false"), served))
        client.__enter__()
        clients.append(client)
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        return client, served.model

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def test_prompt_and_emotion_reach_a_family_with_prompt_style(app_of):
    client, model = app_of(_served("expressive", Capabilities(prompt_style=True, durations=False)))
    response = _speech(client, prompt="Whisper, as if telling a secret.", emotion="calm")
    assert response.status_code == 200, response.text
    assert len(response.content) == 2 * SAMPLES_PER_ID * len("Hello there.")  # 16-bit samples
    (request,) = model.requests
    assert (request.voice.prompt, request.voice.emotion) == ("Whisper, as if telling a secret.", "calm")
    assert _speech(client, instructions="Speak cheerfully.").status_code == 200
    assert model.requests[-1].voice.prompt == "Speak cheerfully."  # OpenAI's name for the prompt
    both = _speech(client, prompt="a", instructions="b")
    assert both.status_code == 400 and both.json()["error"]["code"] == "conflicting_parameters"
    assert _speech(client).status_code == 200 and model.requests[-1].voice is None


@pytest.mark.parametrize("field", ["emotion", "prompt", "instructions"])
def test_style_fields_answer_400_naming_the_family_without_prompt_style(app_of, field):
    client, model = app_of(_served("plain", Capabilities(durations=False)))
    response = _speech(client, **{field: "happy"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", field)
    assert "family plain takes no" in error["message"] and not model.requests


def test_sampling_fields_are_the_family_options(app_of):
    """noise_scale is an option of VITS-style sampling; a family sampling otherwise answers 400."""
    client, model = app_of(_served("tokens", Capabilities(durations=False), AutoregressiveSampling))
    response = _speech(client, noise_scale_w=0.3)
    assert response.status_code == 400 and response.json()["error"]["param"] == "noise_scale_w"
    assert "family tokens takes no noise_scale_w" in response.json()["error"]["message"]
    assert "top_k" in response.json()["error"]["message"]
    client, model = app_of(_served("vits_like", Capabilities(durations=False), VitsSampling, noise_channels=4))
    assert _speech(client, noise_scale=0.1, seed=5, speed=2.0).status_code == 200
    sampling = model.requests[-1].sampling
    assert isinstance(sampling, VitsSampling)
    assert (sampling.noise_scale, sampling.noise_scale_w, sampling.length_scale, sampling.seed) == (0.1, 0.8, 0.5, 5)
    assert sampling.prior_noise.shape[:2] == (1, 4)  # the sentence's own noise, drawn by the batcher


@pytest.mark.parametrize("field", ["emotion", "prompt", "instructions"])
def test_the_bundled_voice_refuses_style_fields(app_of, field):
    client, _ = app_of(served_variant("original_onnx"))
    response = _speech(client, **{field: "happy"})
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("unsupported_parameter", field)


def _speechlike_wav(seconds: float = 2.0) -> bytes:
    """Two seconds of the bundled voice: speech the speaker encoder accepts."""
    served = served_variant("original_onnx")
    request = SynthesisRequest.from_utterances(
        served.model.text_to_utterances("The birch canoe slid on the smooth planks. Glue the sheet to the dark "
                                        "blue background."), sampling=VitsSampling(seed=0))
    waveform = np.concatenate([w.numpy() for w in served.model.synthesize(request).waveforms()])
    buffer = io.BytesIO()
    soundfile.write(buffer, waveform * 0.8, served.model.sample_rate_hz, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_a_zero_shot_family_speaks_with_the_uploaded_clip_and_transcript(app_of):
    capabilities = Capabilities(zero_shot=True, zero_shot_needs_transcript=True, durations=False)
    client, model = app_of(_served("cloning", capabilities))
    wav = _speechlike_wav()
    bare = client.post("/v1/voices", files={"file": ("me.wav", wav, "audio/wav")})
    assert bare.status_code == 201 and bare.json()["usable"] is False and "transcript" in bare.json()["note"]
    refused = _speech(client, voice=bare.json()["id"])
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "transcript_required"
    upload = client.post("/v1/voices", files={"file": ("me.wav", wav, "audio/wav")},
                         data={"transcript": "The birch canoe slid on the smooth planks."})
    assert upload.status_code == 201 and upload.json()["usable"] is True
    assert _speech(client, voice=upload.json()["id"]).status_code == 200
    reference = model.requests[-1].voice.reference
    assert reference.transcript == "The birch canoe slid on the smooth planks."
    assert reference.sample_rate_hz == 16_000 and reference.waveform.ndim == 1


def test_an_autoregressive_model_without_a_step_decoder_is_refused_at_start(tmp_path):
    served = _served("talker", Capabilities(autoregressive=True, streaming_unit="tokens", durations=False),
                     AutoregressiveSampling)
    with pytest.raises(SchedulerUnavailableError, match="family talker is autoregressive.*no step_decoder"):
        create_app(serve_settings(tmp_path, "serve.warmup=false"), served)
