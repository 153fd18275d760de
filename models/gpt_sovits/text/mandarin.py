"""Mandarin text -> v2 phones and ``word2ph``: jieba words, pypinyin readings, tone sandhi, symbols.

Each hanzi becomes two phones, an initial and a toned final (``你`` -> ``n i3``; a syllable spelled with
a bare vowel gets a zero initial, ``安`` -> ``AA an1``); each kept punctuation mark becomes itself. So
``word2ph`` has one entry per character of the normalised text (2 for a hanzi, 1 for a mark), which
is how the official pipeline spreads a character's BERT feature over its phones.

The official v2 front end reads polyphones with G2PW, a BERT-based model whose weights are not
available here. This front end does not need it: readings come from pypinyin's phrase dictionary
(the official front end's fallback), so a polyphone whose reading only sentence context decides
(e.g. 行 xing2/hang2 outside a known phrase) can differ from what the official front end says.
The official's full text normaliser (dates, phone numbers, units) is replaced by the number
readings of ``mandarin_numbers``.
"""
from __future__ import annotations

import logging
import re

import jieba
import jieba.posseg

from models.gpt_sovits.text.mandarin_numbers import read_numbers_zh
from models.gpt_sovits.text.pinyin_phones import (
    dictionary_syllables,
    pinyin_to_initial_final,
)
from models.gpt_sovits.text.symbols import PUNCTUATION
from models.gpt_sovits.text.tone_sandhi import (
    Tones,
    apply_sandhi,
    merge_for_sandhi,
    word_lists,
)
from models.interface import UnspeakableTextError

jieba.setLogLevel(logging.WARNING)  # jieba logs its dictionary loading at INFO on every first use

# Marks the official Mandarin front end rewrites onto the v2 punctuation; longest first ("..." before ".").
# Dashes (—) are not among them: the official normaliser drops them, and reads ASCII "-" as 减.
_PUNCTUATION_MAP = {
    "...": "…", "：": ",", "；": ",", ":": ",", ";": ",", "，": ",", "。": ".", "！": "!", "？": "?",
    "\n": ".", "·": ",", "、": ",", "$": ".", "~": "…", "～": "…",
}
_PUNCTUATION_PATTERN = re.compile("|".join(re.escape(mark) for mark in _PUNCTUATION_MAP))
# Interjections whose dictionary readings (n2, m2) have no v2 symbols; the official reads them as 恩 and 母.
_CHARACTER_SWAPS = str.maketrans({"嗯": "恩", "呣": "母"})
_PUNCTUATION_CLASS = "".join(re.escape(mark) for mark in PUNCTUATION)
_NOT_KEPT = re.compile(rf"[^\u4e00-\u9fa5{_PUNCTUATION_CLASS}]+")
_REPEATED_PUNCTUATION = re.compile(rf"([{_PUNCTUATION_CLASS}])[{_PUNCTUATION_CLASS}]+")
_CLAUSE_END = re.compile(rf"(?<=[{_PUNCTUATION_CLASS}])\s*")
_ERHUA_BLOCKING_TAGS = {"a", "j", "nr"}  # adjectives, abbreviations, person names keep 儿 as a syllable


def normalize_mandarin(text: str) -> str:
    """Numbers read out, marks mapped onto the v2 punctuation, every other non-hanzi dropped."""
    text = read_numbers_zh(text).translate(_CHARACTER_SWAPS)
    text = _PUNCTUATION_PATTERN.sub(lambda match: _PUNCTUATION_MAP[match.group()], text)
    text = _NOT_KEPT.sub("", text)
    return _REPEATED_PUNCTUATION.sub(r"\1", text)


def mandarin_to_phones(text: str) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
    """(normalised text, phones, phones per character of the normalised text) of one Mandarin run."""
    normalized = normalize_mandarin(text)
    phones: list[str] = []
    word2ph: list[int] = []
    for clause in (part for part in _CLAUSE_END.split(normalized) if part):
        words = [(pair.word, pair.flag) for pair in jieba.posseg.lcut(clause)]
        for word, tag in merge_for_sandhi(words):
            syllables = dictionary_syllables(word)
            tones = apply_sandhi(word, tag, [syllable[-1] if syllable else None for syllable in syllables])
            tones = _erhua_tones(word, tag, tones)
            for char, syllable, tone in zip(word, syllables, tones):
                char_phones = _character_phones(char, syllable, tone)
                phones += char_phones
                word2ph.append(len(char_phones))
    return normalized, tuple(phones), tuple(word2ph)


def _character_phones(char: str, syllable: str | None, tone: str | None) -> list[str]:
    if syllable is None:
        if char in PUNCTUATION:
            return [char]
        raise UnspeakableTextError(f"no Mandarin reading for {char!r} (U+{ord(char):04X}); give it in another form")
    initial_final = pinyin_to_initial_final(syllable[:-1])
    if initial_final is None or tone is None:
        raise UnspeakableTextError(
            f"the reading {syllable!r} of {char!r} has no GPT-SoVITS v2 symbols; replace the character"
        )
    initial, final = initial_final
    return [initial, final + tone]


def _erhua_tones(word: str, tag: str, tones: Tones) -> Tones:
    """A word-final 儿 read as erhua takes the tone of the syllable before it (玩儿 -> wan2 er2)."""
    if not word.endswith("儿"):
        return tones
    tones = list(tones)
    if tones[-1] == "1":
        tones[-1] = "2"  # 儿 is never er1
    lists = word_lists()
    if word not in lists["erhua_words"] and (word in lists["never_erhua_words"] or tag in _ERHUA_BLOCKING_TAGS):
        return tones
    if len(word) > 1 and tones[-1] in ("2", "5") and word[-2:] not in lists["never_erhua_words"] and tones[-2]:
        tones[-1] = tones[-2]
    return tones
