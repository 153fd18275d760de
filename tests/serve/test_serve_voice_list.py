"""GET /v1/voices lists every voice the served family offers, read from its registry entry: the
served voice, each row of its speaker table (EmotiVoice on tiny random weights), then uploads, a page
at a time, with the emotions ``emotion`` accepts; bad paging parameters answer 400 JSON.

    python -m pytest -q tests/serve/test_serve_voice_list.py
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from conftest import compose_config
from fastapi.testclient import TestClient
from serve_support import serve_settings, served_variant

from models.emotivoice.capabilities import CAPABILITIES
from models.emotivoice.family import FAMILY
from models.emotivoice.tiny import TINY_SPEAKERS, tiny_voice
from serve.app import create_app
from serve.engines import served_as_is
from serve.settings import serve_settings_from_config
from serve.voices import DEFAULT_VOICES_PER_PAGE, MAX_VOICES_PER_PAGE

RELEASED_SPEAKERS = 2014  # rows of the released EmotiVoice speaker table (models/emotivoice/data manifest)


def _client(tmp_path, family) -> TestClient:
    settings = serve_settings_from_config(compose_config(tmp_path, ["model=emotivoice", "serve.source=teacher",
                                                                    "serve.warmup=false"]))
    return TestClient(create_app(settings, served_as_is(tiny_voice(0), family, "teacher", family.default_voice)))


def _ready(client: TestClient) -> TestClient:
    deadline = time.monotonic() + 30
    while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    return client


@pytest.fixture(scope="module")
def tiny_client(tmp_path_factory):
    torch.set_num_threads(1)
    with _client(tmp_path_factory.mktemp("tiny"), FAMILY) as client:
        yield _ready(client)


@pytest.fixture(scope="module")
def released_size_client(tmp_path_factory):
    """The tiny voice behind a family entry naming 2014 speakers, as the released speaker2 file does
    ("8051"-style names): the listing reads names from ``Family.speaker_names`` alone."""
    names = tuple(str(8000 + row) for row in range(RELEASED_SPEAKERS))
    family = dataclasses.replace(FAMILY, speaker_names=lambda voice: names)
    with _client(tmp_path_factory.mktemp("released"), family) as client:
        yield _ready(client)


def test_the_tiny_voice_lists_its_speakers_and_emotions_and_each_listed_speaker_speaks(tiny_client):
    listing = tiny_client.get("/v1/voices")
    assert listing.status_code == 200, listing.text
    body = listing.json()
    assert body["total"] == 1 + TINY_SPEAKERS and not body["has_more"]
    assert [voice["kind"] for voice in body["data"]] == ["builtin", *["speaker"] * TINY_SPEAKERS]
    speakers = body["data"][1:]
    assert [(voice["id"], voice["speaker_row"], voice["aliases"]) for voice in speakers] == [
        (str(row), row, []) for row in range(TINY_SPEAKERS)]  # tiny names are their rows: no row alias
    assert body["style_prompts"] is True and body["emotions"] == list(CAPABILITIES.emotions)
    assert {"开心", "happy", "悲伤", "sad"} <= set(body["emotions"])
    audio = {}
    for voice in speakers:
        response = tiny_client.post("/v1/audio/speech", json={"model": "teacher", "voice": voice["id"],
                                                              "input": "今天天气很好。", "response_format": "pcm",
                                                              "emotion": body["emotions"][0]})
        assert response.status_code == 200, response.text
        audio[voice["id"]] = response.content
    assert len(set(audio.values())) == TINY_SPEAKERS  # each listed row is a different speaker


def test_2014_speakers_page_through_without_gaps(released_size_client):
    first = released_size_client.get("/v1/voices").json()
    assert (first["total"], first["offset"], first["limit"]) == (1 + RELEASED_SPEAKERS, 0, DEFAULT_VOICES_PER_PAGE)
    assert len(first["data"]) == DEFAULT_VOICES_PER_PAGE and first["has_more"]
    assert first["data"][1] == {**first["data"][1], "id": "8000", "speaker_row": 0, "aliases": ["0"]}
    seen, offset = [], 0
    while True:
        page = released_size_client.get("/v1/voices", params={"limit": MAX_VOICES_PER_PAGE, "offset": offset}).json()
        seen += [voice["id"] for voice in page["data"]]
        if not page["has_more"]:
            break
        offset += page["limit"]
    assert len(seen) == len(set(seen)) == 1 + RELEASED_SPEAKERS and offset == 2 * MAX_VOICES_PER_PAGE
    assert seen[-1] == str(8000 + RELEASED_SPEAKERS - 1)
    past_the_end = released_size_client.get("/v1/voices", params={"offset": 5000}).json()
    assert (past_the_end["data"], past_the_end["has_more"], past_the_end["total"]) == ([], False, 2015)
    # A listed name and its row alias both speak (serve/speech.py takes a name, then a row number).
    by_name = released_size_client.post("/v1/audio/speech", json={
        "model": "teacher", "voice": "8002", "input": "今天天气很好。", "response_format": "pcm"})
    by_row = released_size_client.post("/v1/audio/speech", json={
        "model": "teacher", "voice": "2", "input": "今天天气很好。", "response_format": "pcm"})
    assert by_name.status_code == by_row.status_code == 200 and by_name.content == by_row.content


@pytest.mark.parametrize("query, param", [
    ("limit=0", "limit"), ("limit=-1", "limit"), (f"limit={MAX_VOICES_PER_PAGE + 1}", "limit"),
    ("limit=abc", "limit"), ("limit=1.5", "limit"), ("limit=", "limit"), ("offset=-5", "offset"),
    ("offset=1e3", "offset"), (f"offset={2**63}", "offset"), ("limit=5&limit=6", "limit"), ("page=2", "page"),
])
def test_bad_paging_answers_400_json_naming_the_parameter(tiny_client, query, param):
    response = tiny_client.get(f"/v1/voices?{query}")
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["param"] == f"query.{param}" and param in error["message"]


def test_a_family_without_speakers_or_style_prompts_lists_its_one_voice(tmp_path):
    """Piper's bundled joe: no speaker table, no emotions (the listing reads the family's entry alone)."""
    with TestClient(create_app(serve_settings(tmp_path, "serve.warmup=false"), served_variant("original_onnx"))) as client:
        body = client.get("/v1/voices").json()
    assert [(voice["id"], voice["kind"]) for voice in body["data"]] == [("joe", "builtin")]
    assert (body["total"], body["has_more"], body["style_prompts"], body["emotions"]) == (1, False, False, [])
