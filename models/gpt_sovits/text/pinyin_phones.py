"""Hanzi -> pinyin syllables (pypinyin), and a syllable -> the v2 initial and final symbols.

The official front end looks syllables up in an opencpop-style table; that table follows a few
regular rules, which we state instead of listing 429 rows (the test checks them on known rows):

* a syllable spelled with a bare vowel gets a zero initial named after that vowel: ``AA`` before
  a-, ``EE`` before e-, ``OO`` before o- (``an`` -> ``AA an``, ``er`` -> ``EE er``);
* ``y`` and ``w`` are kept as initials and the final is what follows them, except that
  ``yan`` -> ``y En``, ``ye`` -> ``y E`` and ``yu``/``yv``... -> ``y v``... (``yuan`` -> ``y van``);
* after ``j``, ``q``, ``x`` a written ``u`` is ü: ``ju`` -> ``j v``, ``xue`` -> ``x ve``;
* the apical vowel of ``zi ci si`` is ``i0``, that of ``zhi chi shi ri`` is ``ir``;
* everything else keeps its spelled final (``ui``, ``un``, ``iu`` as written, ``lv``, ``nve``).
"""
from __future__ import annotations

import functools
import re

from pypinyin import Style, lazy_pinyin

from models.gpt_sovits.text.symbols import MANDARIN_FINALS, MANDARIN_INITIALS

HANZI = re.compile(r"[\u4e00-\u9fa5]")  # the range the official Mandarin front end keeps
_HANZI_OR_OTHER = re.compile(r"[\u4e00-\u9fa5]+|.", re.DOTALL)

_ZERO_INITIALS = {"a": "AA", "e": "EE", "o": "OO"}
_TWO_LETTER_INITIALS = ("zh", "ch", "sh")
_Y_SPECIAL_FINALS = {"an": "En", "e": "E"}


def pinyin_to_initial_final(syllable: str) -> tuple[str, str] | None:
    """``("n", "i")`` for ``"ni"``; None when the spelling is not a syllable the v2 symbols can write."""
    initial, final = _split(syllable)
    if initial not in MANDARIN_INITIALS or final not in MANDARIN_FINALS:
        return None
    return initial, final


def _split(syllable: str) -> tuple[str, str]:
    if not syllable:
        return "", ""
    if syllable[0] in _ZERO_INITIALS:
        return _ZERO_INITIALS[syllable[0]], syllable
    if syllable[0] == "y":
        rest = syllable[1:]
        if rest in _Y_SPECIAL_FINALS:
            return "y", _Y_SPECIAL_FINALS[rest]
        if rest.startswith(("u", "v")):
            return "y", "v" + rest[1:]
        return "y", rest
    initial = syllable[:2] if syllable.startswith(_TWO_LETTER_INITIALS) else syllable[:1]
    final = syllable[len(initial):]
    if initial in ("j", "q", "x") and final.startswith("u"):
        final = "v" + final[1:]
    elif final == "i" and initial in ("z", "c", "s"):
        final = "i0"
    elif final == "i" and initial in ("zh", "ch", "sh", "r"):
        final = "ir"
    return initial, final


# A word's readings depend on that word alone (sandhi is applied afterwards, across words), and pypinyin
# is about half of a Mandarin sentence's front-end time, so caching by word is exact and common words
# recur. A tuple, so that no caller can change what the next one gets.
@functools.lru_cache(maxsize=1 << 16)
def dictionary_syllables(word: str) -> tuple[str | None, ...]:
    """pypinyin's toned syllable per character ("ni3"; 5 is neutral), None for a non-hanzi character.

    Characters are looked up a run of hanzi at a time, so pypinyin's phrase dictionary picks the
    reading of polyphones in context; without G2PW that phrase dictionary is all we have.
    """
    syllables: list[str | None] = []
    for piece in _HANZI_OR_OTHER.findall(word):
        if HANZI.match(piece):
            readings = lazy_pinyin(piece, style=Style.TONE3, neutral_tone_with_five=True, errors=lambda chars: [""] * len(chars))
            syllables += [reading if reading[-1:].isdigit() else None for reading in readings]
        else:
            syllables.append(None)
    return tuple(syllables)
