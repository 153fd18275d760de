"""espeak-ng phonemes (piper_phonemize's, through models/text/espeak_ng.py), then ids through a voice's
``phoneme_id_map``: each sentence becomes ``^ _ p1 _ p2 _ ... $`` (beginning, a pad after every
phoneme, end), the convention of espeak-based VITS voices.
"""
from __future__ import annotations

import re

from models.interface import UnspeakableTextError, Utterance
from models.text.espeak_ng import espeak_sentences
from models.text.sanitize import fold_kept_punctuation, refuse_unsafe_characters

BOS, EOS, PAD = "^", "$", "_"
# Long paragraphs are split at sentence ends so that no single batch item grows unbounded.
# Only at . ! ?, where espeak ends a sentence too: espeak-based voices speak ; and : as pauses
# inside one sentence, and splitting there would change the phoneme ids and the prosody.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class EspeakFrontend:
    def __init__(self, espeak_voice: str, phoneme_id_map: dict[str, list[int]]):
        for symbol in (BOS, EOS, PAD):
            if symbol not in phoneme_id_map:
                raise ValueError(f"phoneme_id_map lacks the required symbol {symbol!r}")
        self.espeak_voice = espeak_voice
        self.phoneme_id_map = phoneme_id_map

    def split_sentences(self, text: str) -> list[str]:
        return [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]

    def __call__(self, text: str) -> list[Utterance]:
        if not isinstance(text, str) or not text.strip():
            raise UnspeakableTextError("text is empty: give at least one word to speak")
        text = refuse_unsafe_characters(text)  # espeak-ng reads a NUL as the end of the text: refuse, never cut
        sequences = []
        for sentence in self.split_sentences(text):
            for phonemes in espeak_ipa(sentence, self.espeak_voice):
                if not [p for p in phonemes if not p.isspace()]:
                    continue
                sequences.append(self._to_sequence(sentence, phonemes))
        if not sequences:
            raise UnspeakableTextError(
                f"no phonemes for {text[:60]!r}: espeak voice {self.espeak_voice!r} cannot speak it"
            )
        return sequences

    def _to_sequence(self, sentence: str, phonemes: list[str]) -> Utterance:
        unknown = sorted({p for p in phonemes if p not in self.phoneme_id_map})
        if unknown:
            raise UnspeakableTextError(
                f"phonemes {unknown} in {sentence[:60]!r} are not in this voice's phoneme_id_map"
            )
        ids = list(self.phoneme_id_map[BOS]) + list(self.phoneme_id_map[PAD])
        for phoneme in phonemes:
            ids += self.phoneme_id_map[phoneme] + self.phoneme_id_map[PAD]
        ids += self.phoneme_id_map[EOS]
        return Utterance(text=sentence, phonemes=tuple(phonemes), phoneme_ids=tuple(ids))


def espeak_ipa(text: str, espeak_voice: str) -> list[list[str]]:
    """espeak-ng's IPA symbols of ``text``, one list per sentence: piper_phonemize's phonemes, with
    the voice set once instead of on every call, which leaks (models/text/espeak_ng.py).

    Full-width punctuation is read in its NFKC form first ("，" as ","): espeak-ng reads "，" as
    nothing at all, no pause and no word boundary, in English ("Hello， world" runs the words
    together) and in Mandarin ("你好， 世界" loses the pause and the boundary after 好) alike. The server keeps
    these characters as sent for the frontends that read them (models/text/sanitize.py).
    """
    return espeak_sentences(fold_kept_punctuation(text), espeak_voice)
