"""The Whisper recognizer's plumbing: which unit a language is scored in, the base model joined from
its two packages, the character error rate, and clear errors. Scoring real speech is in
test_metric_validity.py."""
from __future__ import annotations

import numpy as np
import pytest

from evaluate.asr import CharacterErrorRate, WhisperRecognizer, error_rate_metric, error_unit, whisper_model_dir
from evaluate.intelligibility import WordErrorRate


class ScriptedRecognizer:
    """Returns the given transcripts in turn: the metric's arithmetic without a model."""

    def __init__(self, transcripts: list[str], unit: str):
        self.transcripts, self.unit = list(transcripts), unit

    def transcribe(self, waveform, sample_rate_hz: int) -> str:
        return self.transcripts.pop(0)


SILENCE = np.zeros(1600, np.float32)


def test_mandarin_and_japanese_are_scored_by_character():
    assert [error_unit(language) for language in ("en", "en-US", "zh", "zh-CN", "ja")] == [
        "word", "word", "char", "char", "char"]


def test_character_error_rate_ignores_spaces_punctuation_and_width():
    metric = CharacterErrorRate(ScriptedRecognizer(["今日は いい 天気ですね", "ＡＢＣ、こんにちは"], "char"))
    metric.update(SILENCE, 16000, "今日はいい天気ですね。")
    metric.update(SILENCE, 16000, "ABCこんばんは")  # full-width ＡＢＣ is ABC; こんにちは vs こんばんは
    # 0 edits over 10 characters, then 2 substitutions (ば->に, ん->ち) over 8.
    assert float(metric.compute()) == pytest.approx(2 / 18)


def test_word_error_rate_normalizes_the_transcript_like_the_text():
    metric = WordErrorRate(ScriptedRecognizer(["Thanks so much for the 5 gifted subs, Marisol."], "word"))
    metric.update(SILENCE, 16000, "Thanks so much for the five gifted subs, Marisol!")
    assert float(metric.compute()) == 0.0


def test_the_metric_follows_the_recognizer_language():
    assert error_rate_metric(ScriptedRecognizer([], "char"))[0] == "cer"
    assert error_rate_metric(ScriptedRecognizer([], "word"))[0] == "wer"


def test_base_model_is_joined_once_from_its_two_packages(tmp_path):
    folder = whisper_model_dir("base", tmp_path)
    model_bin = folder / "model.bin"
    assert model_bin.stat().st_size == 145_217_532  # 72,608,766 bytes in each package
    assert {path.name for path in folder.iterdir()} == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    modified = model_bin.stat().st_mtime_ns
    assert whisper_model_dir("base", tmp_path) == folder and model_bin.stat().st_mtime_ns == modified


def test_unknown_model_and_english_only_model_for_japanese_are_refused():
    with pytest.raises(ValueError, match="use one of"):
        whisper_model_dir("large-v3")
    with pytest.raises(ValueError, match="English only"):
        WhisperRecognizer("tiny.en", language="ja")
