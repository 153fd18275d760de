"""The server takes a request as it was sent or refuses it, naming what is wrong; it never repairs,
cuts or coerces it: control characters in text, numbers sent as strings or booleans, duplicate JSON
keys, a body that is not application/json or not UTF-8, and upload errors that name the form field.
HEAD on the probes answers like GET.

    python -m pytest -q tests/serve/test_serve_strict_input.py
"""
from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from models.family import Family
from models.interface import Capabilities, SynthesisRequest, SynthesisResult, Utterance
from models.sampling import VitsSampling
from serve.app import create_app
from serve.engines import ServedModel
from serve_support import serve_settings, wait_until

SAMPLE_RATE_HZ = 16_000
SAMPLES_PER_ID = 160  # 10 ms of audio per phoneme id
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "pcm"}
JSON_HEADERS = {"content-type": "application/json"}


class TextRecordingModel:
    """A TTSModel of a made-up family that keeps every text its frontend is given; one id per character."""

    family = "recorder"
    sample_rate_hz = SAMPLE_RATE_HZ
    capabilities = Capabilities(zero_shot=True, prompt_style=True, durations=False)
    sampling_type = VitsSampling

    def __init__(self):
        self.texts: list[str] = []
        self.requests: list[SynthesisRequest] = []

    def text_to_utterances(self, text: str) -> list[Utterance]:
        self.texts.append(text)
        return [Utterance(text, tuple(text), tuple(1 + ord(c) % 50 for c in text))]

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.requests.append(request)
        audio_lengths = request.phoneme_lengths * SAMPLES_PER_ID  # (B,)
        return SynthesisResult(torch.zeros(len(audio_lengths), int(audio_lengths.max())), audio_lengths,
                               SAMPLE_RATE_HZ)  # (B, T_audio) of silence

    def parts(self) -> dict:
        return {}

    def replace_part(self, role, module) -> None:
        raise NotImplementedError(f"{self.family} has no replaceable parts")


@pytest.fixture(scope="module")
def served_client(tmp_path_factory):
    """(client, model) of a started app over the recording model."""
    model = TextRecordingModel()
    family = Family(name=model.family, capabilities=model.capabilities, sampling_type=model.sampling_type,
                    part_roles=(), load_teacher=lambda voice, cache_dir: model, tiny_model=lambda seed: model,
                    default_voice="narrator")
    served = ServedModel(model, "recorder-variant", family, "torch", "narrator", noise_channels=4)
    settings = serve_settings(tmp_path_factory.mktemp("strict"), "serve.warmup=false")
    with TestClient(create_app(settings, served)) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        yield client, model


@pytest.fixture
def client(served_client):
    return served_client[0]


def _error(response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["message"] and error["type"] and "object at 0x" not in error["message"]
    return error


def _post_raw(client, body: bytes, headers: dict | None = None):
    return client.post("/v1/audio/speech", content=body, headers=JSON_HEADERS if headers is None else headers)


# ---------------------------------------------------------------- text: refused, never cut

@pytest.mark.parametrize("text, codepoint, position", [
    ("hi \u0000 there", "U+0000", 3),  # espeak-ng stopped at the NUL: 200 and only "hi" spoken
    ("Hello\x00world\x07...", "U+0000", 5),
    ("ring \x07 the bell", "U+0007", 5),
    ("pay \u202e01$ now", "U+202E", 4),
])
def test_control_characters_in_input_answer_invalid_text(served_client, text, codepoint, position):
    client, model = served_client
    spoken_before = len(model.texts)
    error = _error(client.post("/v1/audio/speech", json={**SPEECH, "input": text}), 400, "invalid_text", "input")
    assert codepoint in error["message"] and f"position {position}" in error["message"]
    assert error["message"].startswith("input:")
    assert len(model.texts) == spoken_before  # nothing reached the frontend


def test_a_lone_surrogate_escape_answers_invalid_text(client):
    body = b'{"model": "tts-1", "voice": "alloy", "input": "ab\\ud800cd"}'
    error = _error(_post_raw(client, body), 400, "invalid_text", "input")
    assert "U+D800" in error["message"] and "position 2" in error["message"]


def test_the_frontend_gets_nfkc_text_with_whitespace_runs_as_one_space(served_client):
    client, model = served_client
    response = client.post("/v1/audio/speech", json={**SPEECH, "input": "Ｈｅｌｌｏ\t\tthere,\n\u00a0friend."})
    assert response.status_code == 200, response.text
    assert model.texts[-1] == "Hello there, friend."


@pytest.mark.parametrize("field", ["prompt", "instructions", "emotion"])
def test_control_characters_in_style_text_answer_invalid_text(client, field):
    error = _error(client.post("/v1/audio/speech", json={**SPEECH, field: "calm\x00ly"}), 400, "invalid_text", field)
    assert "U+0000" in error["message"] and "position 4" in error["message"]


# ---------------------------------------------------------------- types: no coercion

@pytest.mark.parametrize("change, field, expected", [
    ({"speed": True}, "speed", "must be a JSON number, not a boolean"),
    ({"speed": "1.5"}, "speed", "must be a JSON number, not a string"),
    ({"seed": "7"}, "seed", "must be a JSON integer, not a string"),
    ({"seed": True}, "seed", "must be a JSON integer, not a boolean"),
    ({"seed": 7.0}, "seed", "must be a JSON integer, not a decimal number"),
    ({"noise_scale": "0.5"}, "noise_scale", "must be a JSON number, not a string"),
    ({"noise_scale_w": False}, "noise_scale_w", "must be a JSON number, not a boolean"),
    ({"input": 12}, "input", "must be a JSON string, not an integer"),
])
def test_numbers_and_booleans_are_not_coerced(client, change, field, expected):
    error = _error(client.post("/v1/audio/speech", json={**SPEECH, **change}), 400, "invalid_value", field)
    assert error["message"] == f"{field}: {expected}"


def test_integer_speed_and_numbers_of_the_right_type_pass(client):
    response = client.post("/v1/audio/speech", json={**SPEECH, "speed": 2, "seed": 7, "noise_scale": 0})
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------- the body: JSON, UTF-8, each key once

def test_duplicate_keys_answer_400_naming_the_key(client):
    body = b'{"model": "tts-1", "voice": "../x", "voice": "alloy", "input": "Hi."}'
    error = _error(_post_raw(client, body), 400, "duplicate_key", "voice")
    assert "'voice' appears twice" in error["message"]
    nested = b'{"model": "tts-1", "voice": {"id": "alloy", "id": "joe"}, "input": "Hi."}'
    _error(_post_raw(client, nested), 400, "duplicate_key", "id")


@pytest.mark.parametrize("headers", [{}, {"content-type": "text/plain"}, {"content-type": "text/plain; charset=utf-8"},
                                     {"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "application/json; charset=latin-1"}])
def test_a_body_not_sent_as_application_json_answers_415(client, headers):
    body = b'{"model": "tts-1", "voice": "alloy", "input": "Hi."}'
    error = _error(_post_raw(client, body, headers), 415, "unsupported_media_type")
    assert "application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/json; charset=UTF-8",
                                          "application/vnd.api+json"])
def test_json_content_types_are_accepted(client, content_type):
    body = b'{"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "pcm"}'
    assert _post_raw(client, body, {"content-type": content_type}).status_code == 200


def test_a_body_that_is_not_utf8_answers_invalid_encoding(client):
    body = b'{"model": "tts-1", "voice": "alloy", "input": "caf\xe9"}'  # Latin-1 e-acute
    error = _error(_post_raw(client, body), 400, "invalid_encoding")
    assert "0xE9" in error["message"] and "UTF-8" in error["message"]


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_numbers_answer_invalid_json(client, number):
    body = b'{"model": "tts-1", "voice": "alloy", "input": "Hi.", "speed": ' + number + b"}"
    _error(_post_raw(client, body), 400, "invalid_json")


def test_deeply_nested_json_answers_invalid_json_not_500(client):
    too_deep = b"[" * 5_000  # past Python's recursion limit of 1000
    body = b'{"model": "tts-1", "voice": "alloy", "input": "Hi.", "speed": ' + too_deep + b"}"
    _error(_post_raw(client, body), 400, "invalid_json")


def test_an_empty_body_names_what_to_send(client):
    error = _error(_post_raw(client, b""), 400, "missing_parameter")
    assert "empty" in error["message"] and "None" not in error["message"]


# ---------------------------------------------------------------- uploads: the field and what is accepted

def test_upload_errors_name_the_field_and_the_accepted_formats(client):
    response = client.post("/v1/voices", files={"file": ("clip.wav", b"this is not audio at all " * 40, "audio/wav")})
    error = _error(response, 400, "invalid_audio", "file")
    assert error["message"].startswith("file:") and "WAV, FLAC or OGG" in error["message"]
    assert "Format not recognised" in error["message"]  # libsndfile's own reason, without its file object


def test_an_upload_transcript_with_control_characters_answers_invalid_text(client):
    response = client.post("/v1/voices", files={"file": ("clip.wav", b"RIFF", "audio/wav")},
                           data={"transcript": "The birch\x00canoe"})
    error = _error(response, 400, "invalid_text", "transcript")
    assert "U+0000" in error["message"] and "position 9" in error["message"]


# ---------------------------------------------------------------- probes: HEAD answers like GET

@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_head_on_probes_answers_like_get_without_a_body(client, path):
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == "application/json"


def test_head_on_readyz_says_503_while_not_ready(client):
    state = client.app.state.serve
    state.ready = False
    try:
        head = client.head("/readyz")
    finally:
        state.ready = True
    assert head.status_code == 503 and head.content == b"" and head.headers["retry-after"] == "1"
