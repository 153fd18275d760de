"""The Mandarin evaluation set (eval_zh): its size, one sentence a line, its lengths, every sentence
speakable by EmotiVoice's front end, and the rule that nothing calibrates on it.

    python -m pytest -q tests/texts/test_texts_zh.py
"""
from __future__ import annotations

import re
import statistics
import unicodedata

import pytest

from compress.settings import DataSettings
from core.config import ConfigError
from models.emotivoice.frontend import split_sentences
from models.emotivoice.tiny import tiny_voice
from texts import load_sentences


def _characters(sentence: str) -> int:
    return sum(1 for ch in sentence if not unicodedata.category(ch).startswith("P"))


def test_forty_unique_mandarin_sentences_of_about_fifteen_characters():
    sentences = load_sentences("eval_zh")
    assert len(sentences) == 40 and len(set(sentences)) == 40
    for sentence in sentences:
        assert split_sentences(sentence) == [sentence], f"{sentence!r} is not one sentence"
        assert re.fullmatch(r"[\u4e00-\u9fff，]+[。！？]", sentence), f"{sentence!r}: Han characters and marks only"
    lengths = [_characters(sentence) for sentence in sentences]
    assert min(lengths) >= 13 and max(lengths) <= 19
    assert 14.5 <= statistics.mean(lengths) <= 16.0  # the 15-character sentence EmotiVoice's targets name


def test_every_sentence_is_one_utterance_of_the_front_end():
    frontend = tiny_voice().frontend  # the released symbol set; the tokenlist is synthetic, the G2P is not
    for sentence in load_sentences("eval_zh"):
        (utterance,) = frontend(sentence)
        assert 35 <= len(utterance.phoneme_ids) <= 60, (sentence, len(utterance.phoneme_ids))


def test_nothing_calibrates_on_it():
    with pytest.raises(ConfigError, match="never calibrate on an evaluation set"):
        DataSettings(eval_set="eval", calibration_set="eval_zh")
