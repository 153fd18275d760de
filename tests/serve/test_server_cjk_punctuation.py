"""Full-width CJK punctuation through the HTTP server reaches EmotiVoice's and GPT-SoVITS's frontends
as the client sent it, so a sentence spoken through the server gets the phonemes (and prosody breaks)
the family frontend gives the same text called directly. Under plain NFKC "，" would become "," and
EmotiVoice would write the short break sp1 where its frontend writes sp3.

    python -m pytest -q tests/serve/test_server_cjk_punctuation.py
"""
from __future__ import annotations


import pytest
from serve_support import tiny_family_client

from models.registry import FAMILIES
from serve.loadtest import join_sentences, pick_sentences

# (family, text with full-width or half-width CJK punctuation, the same text as NFKC writes it).
SENTENCES = {
    "emotivoice": ("今天天气很好，我们去公园吧。", "今天天气很好,我们去公园吧。"),
    # GPT-SoVITS folds full-width ASCII ("，") itself; the half-width "､" it drops, while NFKC's "、" is a comma.
    "gpt_sovits_v2": ("今天天气很好､我们去公园吧。", "今天天气很好、我们去公园吧。"),
}


def unpadded_ids(request) -> list[tuple[int, ...]]:
    """Each row of a ``SynthesisRequest``'s phoneme ids without its padding."""
    return [tuple(row[:int(length)].tolist())
            for row, length in zip(request.phoneme_ids, request.phoneme_lengths)]  # (B, T_text), (B,)


class PhonemeRecorder:
    """A family's model, unchanged, that keeps what its frontend gave the server (``utterances``) and
    the phoneme ids the model was asked to say (``requested_ids``): through ``synthesize`` where the
    server batches whole sentences, through its step decoder's ``join`` where it decodes token by token."""

    def __init__(self, model):
        self._model = model
        self.utterances: list = []
        self.requested_ids: list[tuple[int, ...]] = []

    def text_to_utterances(self, text: str):
        utterances = self._model.text_to_utterances(text)
        self.utterances.extend(utterances)
        return utterances

    def synthesize(self, request):
        self.requested_ids.extend(unpadded_ids(request))
        return self._model.synthesize(request)

    def step_decoder(self, *args, **kwargs):  # asked for only when capabilities.autoregressive says so
        return JoinRecorder(self._model.step_decoder(*args, **kwargs), self.requested_ids)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class JoinRecorder:
    """A step decoder, unchanged, that adds the phoneme ids of every sentence joining it to ``requested_ids``."""

    def __init__(self, decoder, requested_ids: list[tuple[int, ...]]):
        self._decoder = decoder
        self._requested_ids = requested_ids

    def join(self, key, request) -> None:
        self._requested_ids.extend(unpadded_ids(request))
        return self._decoder.join(key, request)

    def __getattr__(self, name: str):
        return getattr(self._decoder, name)


def speak_recorded(client, recorder: PhonemeRecorder, voice: str, text: str) -> None:
    """POST ``text`` as a WAV speech request with ``recorder`` emptied first; the server must answer 200."""
    recorder.utterances.clear()
    recorder.requested_ids.clear()
    response = client.post("/v1/audio/speech", json={"model": "teacher", "voice": voice, "input": text,
                                                     "response_format": "wav"})
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module", params=sorted(SENTENCES))
def family_client(request, tmp_path_factory):
    """(family name, its tiny model, the recorder, a client of the server in front of it, voice id), ready."""
    family = FAMILIES[request.param]
    model = family.tiny_model(0)
    recorder = PhonemeRecorder(model)
    with tiny_family_client(family, recorder, tmp_path_factory.mktemp(family.name)) as (client, voice):
        yield family.name, model, recorder, client, voice


def test_cjk_punctuation_gets_the_phonemes_of_the_frontend_called_directly(family_client):
    family, model, recorder, client, voice = family_client
    sent, folded = SENTENCES[family]
    direct = [u.phonemes for u in model.text_to_utterances(sent)]
    assert direct != [u.phonemes for u in model.text_to_utterances(folded)], "the test sentence must tell them apart"
    speak_recorded(client, recorder, voice, sent)
    assert [u.phonemes for u in recorder.utterances] == direct
    assert [u.text for u in recorder.utterances] == [sent]
    assert recorder.requested_ids == [u.phoneme_ids for u in recorder.utterances]


@pytest.mark.parametrize("family_client", ["emotivoice"], indirect=True)  # sp3: EmotiVoice's punctuation break
def test_emotivoice_breaks_at_the_full_width_comma_through_the_server(family_client):
    _, _, recorder, client, voice = family_client
    recorder.utterances.clear()
    response = client.post("/v1/audio/speech", json={"model": "teacher", "voice": voice,
                                                     "input": "今天天气很好，我们去公园吧。", "response_format": "wav"})
    assert response.status_code == 200, response.text
    (utterance,) = recorder.utterances
    phonemes = list(utterance.phonemes)
    hao = phonemes.index("ao3")  # 好 of 很好, just before the comma
    assert phonemes[hao + 1] == "sp3", phonemes  # "," would give sp1 here
    assert phonemes.count("sp3") == 1


def test_the_ideographic_space_the_server_makes_a_space_reads_as_one(family_client):
    # Why models/text/sanitize.py may collapse U+3000 with the other whitespace: neither frontend tells it apart.
    _, model, _, _, _ = family_client
    phonemes = [u.phonemes for u in model.text_to_utterances("今天\u3000天气很好")]
    assert phonemes == [u.phonemes for u in model.text_to_utterances("今天 天气很好")]


@pytest.mark.parametrize("family_client", ["emotivoice"], indirect=True)
def test_a_load_test_request_of_mandarin_sentences_reaches_the_voice_one_sentence_at_a_time(family_client):
    """What ``serve.loadtest --sentence-set eval_zh --sentences-per-request 8`` sends: eight held-out sentences
    joined with spaces. The voice gets each as its own utterance, with the ids its frontend gives it alone, so
    the load tester's sentences/s counts what the server batched."""
    _, model, recorder, client, voice = family_client
    sentences = pick_sentences(13, 19, "eval_zh")[:8]
    (text,) = join_sentences(sentences, 8)[:1]
    speak_recorded(client, recorder, voice, text)
    assert [u.text for u in recorder.utterances] == sentences
    assert sorted(recorder.requested_ids) == sorted(model.text_to_utterances(s)[0].phoneme_ids for s in sentences)

