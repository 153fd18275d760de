"""``tts_frontend_seconds``: each speech request's time in the family's front end, on /metrics. A
Mandarin request costs the host about ten times an English one (pypinyin and jieba in pure Python),
and this is where a loaded server shows it.

    python -m pytest -q tests/serve/test_frontend_metric.py
"""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import tiny_family_client

from models.registry import FAMILIES


@pytest.fixture(scope="module")
def client_and_voice(tmp_path_factory):
    family = FAMILIES["emotivoice"]
    with tiny_family_client(family, family.tiny_model(0), tmp_path_factory.mktemp("frontend")) as pair:
        yield pair


def frontend_seconds(client) -> tuple[float, float, float]:
    """(requests, wall seconds, CPU seconds) of the front end on the server's /metrics."""
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name in ("tts_frontend_seconds", "tts_frontend_cpu_seconds"):
            found.update({sample.name: sample.value for sample in family.samples})
    return (found["tts_frontend_seconds_count"], found["tts_frontend_seconds_sum"],
            found["tts_frontend_cpu_seconds_total"])


def speak(client, voice: str, text: str) -> int:
    return client.post("/v1/audio/speech", json={"model": "teacher", "voice": voice, "input": text,
                                                 "response_format": "pcm"}).status_code


def test_each_request_through_the_front_end_is_timed_once(client_and_voice):
    client, voice = client_and_voice
    count, wall_s, cpu_s = frontend_seconds(client)
    assert speak(client, voice, "今天天气很好，我们去公园吧。 The quick brown fox jumps.") == 200
    assert speak(client, voice, "第一章。") == 200
    after_count, after_wall_s, after_cpu_s = frontend_seconds(client)
    assert after_count == count + 2
    assert 0 < after_wall_s - wall_s < 5
    assert 0 < after_cpu_s - cpu_s <= (after_wall_s - wall_s) * 1.05  # a thread's CPU time fits in its wall time


def test_text_the_front_end_refuses_is_timed_and_answered_400(client_and_voice):
    client, voice = client_and_voice
    count, _, _ = frontend_seconds(client)
    assert speak(client, voice, "こんにちは") == 400  # kana: neither of the voice's languages
    assert frontend_seconds(client)[0] == count + 1
