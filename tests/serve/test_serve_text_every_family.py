"""The server's text rule (models/text/sanitize.py) in front of every registered family's frontend,
on its tiny random weights: a control character answers 400 naming it and its position and never
reaches the frontend; whitespace reaches it as single spaces; text given to `serve.synthesize` is
held to the same rule. Before the rule, espeak-ng read "hi \\x00 there" as "hi".

    python -m pytest -q tests/serve/test_serve_text_every_family.py
"""
from __future__ import annotations


import pytest
from serve_support import tiny_family_client

from models.registry import FAMILIES
from models.text.sanitize import first_unsafe_character
from serve.synthesize import read_lines

SPEECH = {"model": "teacher", "input": "Hello there.", "response_format": "wav"}


class FrontendRecorder:
    """A family's model, unchanged, that keeps every text its frontend is given."""

    def __init__(self, model):
        self._model = model
        self.texts: list[str] = []

    def text_to_utterances(self, text: str):
        self.texts.append(text)
        return self._model.text_to_utterances(text)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_client(request, tmp_path_factory):
    """(family, recorder, client, voice id) of the family's tiny model behind the server, ready."""
    family = FAMILIES[request.param]
    recorder = FrontendRecorder(family.tiny_model(0))
    with tiny_family_client(family, recorder, tmp_path_factory.mktemp(family.name)) as (client, voice):
        yield family, recorder, client, voice


@pytest.mark.parametrize("field", ["input", "prompt"])
@pytest.mark.parametrize("text, codepoint, position", [
    ("hi \u0000 there.", "U+0000", 3),
    ("Hello\x07world.", "U+0007", 5),
    ("Hello \u202eereht.", "U+202E", 6),
])
def test_a_control_character_is_refused_before_the_frontend(family_client, field, text, codepoint, position):
    _, recorder, client, voice = family_client
    recorder.texts.clear()
    response = client.post("/v1/audio/speech", json={**SPEECH, "voice": voice, field: text})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_text", field)
    assert codepoint in error["message"] and f"at position {position}" in error["message"]
    assert recorder.texts == []


def test_whitespace_reaches_the_frontend_as_single_spaces(family_client):
    _, recorder, client, voice = family_client
    recorder.texts.clear()
    response = client.post("/v1/audio/speech", json={**SPEECH, "voice": voice, "input": "  Hello\t\tthere.\n"})
    assert response.status_code == 200, response.text
    assert recorder.texts == ["Hello there."]
    assert all(first_unsafe_character(text) is None for text in recorder.texts)


def test_synthesize_cli_lines_follow_the_same_rule(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("\ufeffFirst\tline.\n\n  Second   line.  \n", encoding="utf-8")  # a BOM, tabs, runs
    assert read_lines(lines) == [(1, "First line."), (3, "Second line.")]
    lines.write_text("Fine.\nHello\x00world.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: character U\+0000 .* at position 5"):
        read_lines(lines)
