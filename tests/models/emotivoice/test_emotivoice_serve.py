"""EmotiVoice behind the HTTP server on tiny random weights: emotions, free-text prompts (``prompt``
and OpenAI's ``instructions``) and speakers by name or row reach the voice; an emotion the style
encoder does not know, or a speaker it does not have, answers 400 JSON before any synthesis.

    python -m pytest -q tests/models/emotivoice/test_emotivoice_serve.py
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from conftest import compose_config
from fastapi.testclient import TestClient

from models.emotivoice.family import FAMILY
from models.emotivoice.tiny import tiny_voice
from serve import engines
from serve.app import create_app
from serve.engines import load_served_model, served_as_is
from serve.settings import serve_settings_from_config

TEXT = "今天天气很好。"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    torch.set_num_threads(1)
    tmp_path = tmp_path_factory.mktemp("serve")
    settings = serve_settings_from_config(compose_config(tmp_path, ["model=emotivoice", "serve.source=teacher",
                                                                    "serve.warmup=false"]))
    served = served_as_is(tiny_voice(0), FAMILY, "teacher", FAMILY.default_voice)
    with TestClient(create_app(settings, served)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


def _speech(client: TestClient, **fields):
    body = {"model": "teacher", "voice": FAMILY.default_voice, "input": TEXT, "response_format": "pcm", **fields}
    return client.post("/v1/audio/speech", json=body)


def _audio(client: TestClient, **fields) -> bytes:
    response = _speech(client, **fields)
    assert response.status_code == 200, response.text
    assert response.content
    return response.content


def test_two_emotions_give_two_audios(client):
    happy, sad = _audio(client, emotion="happy"), _audio(client, emotion="悲伤")
    assert happy != sad
    assert _audio(client, emotion="开心") == happy  # the English name reads the same prompt
    assert _audio(client) == _audio(client, emotion="neutral")  # no emotion: 普通


def test_free_text_prompts_and_instructions_are_one_field(client):
    prompt = _audio(client, prompt="用非常激动的语气说")
    assert prompt == _audio(client, instructions="用非常激动的语气说")
    assert prompt != _audio(client)


@pytest.mark.parametrize("emotion", ["bored", "HAPPY", ""])
def test_an_unknown_emotion_answers_400_naming_the_known_ones(client, emotion):
    response = _speech(client, emotion=emotion)
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    if emotion:  # the empty string is refused by the request schema itself
        assert (error["code"], error["param"]) == ("unsupported_emotion", "emotion")
        assert "开心" in error["message"] and "happy" in error["message"]


def test_a_speaker_by_name_or_row(client):
    default, row_two = _audio(client), _audio(client, voice="2")
    assert default != row_two
    assert _audio(client, voice="0") == default  # the served voice speaks with row 0
    refused = _speech(client, voice="99")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unknown_voice"
    assert "speaker name" in refused.json()["error"]["message"]


def test_without_a_champion_the_server_speaks_the_teacher(tmp_path, monkeypatch):
    """`python -m serve model=emotivoice`: no champion manifest, and the family ships no graph for the
    usual original_onnx fallback, so the teacher is served (tiny weights stand in for the full size)."""
    tiny = dataclasses.replace(FAMILY, load_teacher=lambda voice, cache_dir: tiny_voice(0))
    monkeypatch.setattr(engines, "get_family", lambda name: tiny)
    settings = serve_settings_from_config(compose_config(tmp_path, [
        "model=emotivoice", f"serve.manifest_path={tmp_path / 'no_manifest.json'}"]))
    served = load_served_model(settings)
    assert served.model_id == "teacher" and "serving teacher" in served.note
