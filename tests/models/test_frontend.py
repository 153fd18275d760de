"""The espeak frontend gives Piper's own phoneme ids, splits sentences and names what it cannot speak.

    python -m pytest -q tests/test_frontend.py
"""
from __future__ import annotations

import piper_phonemize
import pytest

from models.piper.voice_files import PiperVoiceFiles
from models.interface import UnspeakableTextError
from models.text.espeak_frontend import EspeakFrontend, espeak_ipa

# Piper phonemizes a whole line and lets espeak split it; ; and : are pauses inside a sentence.
LINES = [
    "Could you leave the porch light on until midnight?",
    "Seventeen pelicans circled the harbor at dawn, then vanished.",
    "Wow!",
    "The 3 o'clock train leaves from platform 9; don't be late.",
    "Note: the ferry is cancelled. Take the bridge instead! Any questions?",
]


@pytest.fixture(scope="module")
def joe_config() -> dict:
    return PiperVoiceFiles.resolve("bundled:joe").config()


@pytest.fixture(scope="module")
def frontend(joe_config) -> EspeakFrontend:
    return EspeakFrontend(joe_config["espeak"]["voice"], joe_config["phoneme_id_map"])


@pytest.mark.parametrize("line", LINES)
def test_ids_equal_piper_phonemize(frontend, line):
    piper_ids = [piper_phonemize.phoneme_ids_espeak(p) for p in piper_phonemize.phonemize_espeak(line, "en-us")]
    assert [list(sequence.phoneme_ids) for sequence in frontend(line)] == piper_ids


def test_paragraph_splits_into_three_sentences(frontend):
    paragraph = "The rain stopped at noon.  Did anyone bring an umbrella?\nNobody answered!"
    sequences = frontend(paragraph)
    assert [s.text for s in sequences] == [
        "The rain stopped at noon.", "Did anyone bring an umbrella?", "Nobody answered!"
    ]


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "..."])
def test_nothing_to_speak_raises(frontend, text):
    with pytest.raises(UnspeakableTextError):
        frontend(text)


def test_map_without_sentence_start_is_rejected(joe_config):
    id_map = {symbol: ids for symbol, ids in joe_config["phoneme_id_map"].items() if symbol != "^"}
    with pytest.raises(ValueError, match=r"'\^'"):
        EspeakFrontend("en-us", id_map)


def test_phoneme_missing_from_map_is_named(joe_config):
    # Enough for "no" (n ˈ o ʊ) and nothing more: "so" needs s, which this map lacks.
    kept = ("^", "_", "$", "n", "ˈ", "o", "ʊ")
    frontend = EspeakFrontend("en-us", {symbol: joe_config["phoneme_id_map"][symbol] for symbol in kept})
    assert frontend("no")[0].phonemes == ("n", "ˈ", "o", "ʊ")
    with pytest.raises(UnspeakableTextError, match=r"\['s'\]"):
        frontend("so")



def test_english_voice_reads_full_width_punctuation_as_ascii(frontend):
    """The server keeps "，" for the Mandarin frontends; espeak's English voice would hear no pause in it."""
    folded = frontend("Hello, world! Is it fine?")
    assert [u.phoneme_ids for u in frontend("Hello， world！ Is it fine？")] == [u.phoneme_ids for u in folded]
    assert "," in folded[0].phonemes


@pytest.mark.parametrize(("voice", "full_width", "ascii"), [
    ("en-us", "Hello， world", "Hello, world"),
    ("cmn", "你好， 世界", "你好, 世界"),
])
def test_espeak_reads_full_width_punctuation_as_its_ascii_form(voice, full_width, ascii):
    assert espeak_ipa(full_width, voice) == espeak_ipa(ascii, voice)
    # Read as sent, espeak-ng drops "，" and the word boundary after it: "həlˈoʊwˈɜːld".
    assert "," in espeak_ipa(full_width, voice)[0] and " " in espeak_ipa(full_width, voice)[0][:10]
