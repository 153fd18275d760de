"""Mandarin text to EmotiVoice's phoneme symbols: jieba words, pypinyin syllables (tone 5 for the
neutral tone, tone sandhi applied), each syllable split into an initial and a toned final.

Symbols follow the official tokenlist: initials ``b p m ... zh ch sh r z c s`` (no w; y only in yue),
finals with their tone digit (``ang1``, ``iou3``, ``ve2``, ``ii4`` after z/c/s/r, ``iii4`` after zh/ch/sh,
an ``r`` before the tone for erhua), ``sp0`` between the syllables of a word, ``sp1`` after a word,
``sp3`` for punctuation (it replaces the ``sp1`` before it).

    mandarin_phonemes("第一章")  # ['d', 'i4', 'sp0', 'i1', 'sp0', 'zh', 'ang1', 'sp1']
"""
from __future__ import annotations

import functools
import logging
import re
import unicodedata

import jieba
from pypinyin import Style, lazy_pinyin

jieba.setLogLevel(logging.WARNING)  # its dictionary-loading banner is not ours to print

INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z", "c", "s")
# Whole syllables whose written vowel is not the final EmotiVoice uses (pinyin spelling rules).
FINAL_REWRITES = {"ui": "uei", "iu": "iou", "un": "uen", "ue": "ve"}
WORD_PAUSE, SYLLABLE_JOIN, PUNCTUATION_PAUSE = "sp1", "sp0", "sp3"
DIGITS = "零一二三四五六七八九"
SMALL_UNITS = ("", "十", "百", "千")
LARGE_UNITS = ("", "万", "亿", "兆")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _integer_to_chinese(digits: str) -> str:
    digits = digits.lstrip("0") or "0"
    if digits == "0":
        return DIGITS[0]
    if len(digits) > 4 * len(LARGE_UNITS):  # beyond 兆: read digit by digit, as for a phone number
        return "".join(DIGITS[int(d)] for d in digits)
    groups = []
    while digits:
        groups.insert(0, digits[-4:])
        digits = digits[:-4]
    spoken, pending_zero = "", False
    for index, group in enumerate(groups):
        unit = LARGE_UNITS[len(groups) - 1 - index]
        if int(group) == 0:
            pending_zero = bool(spoken)
            continue
        text, zero = "", pending_zero or (bool(spoken) and len(group.lstrip("0")) < 4)
        for position, digit in enumerate(group.zfill(4)):
            value = int(digit)
            if value == 0:
                zero = bool(text) or zero
                continue
            if zero and (text or spoken):
                text += DIGITS[0]
            zero = False
            text += DIGITS[value] + SMALL_UNITS[3 - position]
        spoken += text + unit
        pending_zero = group.endswith("0")
    # 一十二 is said 十二 at the start of a number.
    return spoken[1:] if spoken.startswith("一十") else spoken


def number_to_chinese(number: str) -> str:
    """'2024' -> 二千零二十四, '3.05' -> 三点零五."""
    integer, _, fraction = number.partition(".")
    spoken = _integer_to_chinese(integer)
    if fraction:
        spoken += "点" + "".join(DIGITS[int(d)] for d in fraction)
    return spoken


def numbers_to_chinese(text: str) -> str:
    return NUMBER.sub(lambda match: number_to_chinese(match.group()), text)


def split_syllable(syllable: str) -> tuple[str, str]:
    """A TONE3 pinyin syllable ('zhang1', 'yuan2', 'nv3', 'huar1') -> (initial or '', toned final)."""
    tone, body = syllable[-1], syllable[:-1]
    if not tone.isdigit():
        raise ValueError(f"pinyin syllable {syllable!r} has no tone digit")
    if body in ("n", "ng", "m"):  # interjections 嗯 呣: spoken with a schwa
        body = "e" + body
    erhua = ""
    if body.endswith("r") and body != "er":
        body, erhua = body[:-1], "r"
    if body in ("zi", "ci", "si", "ri"):  # ri with ii, not iii: the released model was trained so
        initial, final = body[0], "ii"
    elif body in ("zhi", "chi", "shi"):
        initial, final = body[:-1], "iii"
    elif body == "yue":  # the official frontend keeps y here (y + ve); its model learned that
        initial, final = "y", "ve"
    elif body.startswith("y"):
        # yi yin ying: the vowel is i itself; yu yue yuan yun: ü; otherwise y- writes i-.
        rest = body[1:]
        initial = ""
        if rest.startswith("u"):
            final = "v" + rest[1:]
        elif rest.startswith("i"):
            final = rest
        else:
            final = "i" + rest
    elif body.startswith("w"):
        initial, final = "", "u" if body == "wu" else "u" + body[1:]
    else:
        initial = next((i for i in INITIALS if body.startswith(i) and len(body) > len(i)), "")
        final = body[len(initial):]
        if initial in ("j", "q", "x") and final.startswith("u"):
            final = "v" + final[1:]  # ju qu xu write ü as u
        final = FINAL_REWRITES.get(final, final)
    return initial, final.replace("ü", "v") + erhua + tone


def _is_punctuation(text: str) -> bool:
    return all(unicodedata.category(ch).startswith("P") or ch.isspace() for ch in text)


def load_dictionaries() -> None:
    """Load jieba's dictionary now (about a second) rather than inside the first request."""
    jieba.initialize()


def mandarin_phonemes(text: str) -> list[str]:
    """Symbols of a Mandarin run (Han characters, punctuation, digits), ending with a pause."""
    words = [word for word in jieba.lcut(numbers_to_chinese(text)) if word.strip()]
    symbols: list[str] = []
    for word in words:
        if _is_punctuation(word):
            if symbols and symbols[-1] == WORD_PAUSE:
                symbols.pop()
            if symbols:
                symbols.append(PUNCTUATION_PAUSE)
            continue
        symbols.extend(word_phonemes(word))
    return symbols


# pypinyin is most of a sentence's cost (about two thirds of 0.47 ms on a 2-core EPYC) and sees one word at a
# time, tone sandhi included, so a word's symbols never depend on its neighbours: caching them is
# exact, and common words recur across sentences.
@functools.lru_cache(maxsize=1 << 16)
def word_phonemes(word: str) -> tuple[str, ...]:
    """Symbols of one jieba word (no punctuation): its syllables joined by ``sp0``, then ``sp1``."""
    syllables = lazy_pinyin(word, style=Style.TONE3, neutral_tone_with_five=True, tone_sandhi=True,
                            errors=lambda chars: [])  # characters with no reading are dropped
    symbols: list[str] = []
    for index, syllable in enumerate(syllables):
        if index:
            symbols.append(SYLLABLE_JOIN)
        symbols.extend(part for part in split_syllable(syllable) if part)
    if syllables:
        symbols.append(WORD_PAUSE)
    return tuple(symbols)
