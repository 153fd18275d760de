"""Splitting text for the v2 front end: refuse unknown scripts, cut sentences, cut language runs.

Every character is one of: a hanzi (Mandarin), a Latin letter, accented or not (English), an ASCII
digit (read in the language of its neighbours), or neutral (spaces, punctuation, symbols, emoji),
which rides along with the run before it. Anything else (kana, hangul, Cyrillic, Arabic, other
digits, CJK ideographs outside the range the official front end reads) is refused, by name.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from models.gpt_sovits.text.pinyin_phones import HANZI
from models.interface import UnspeakableTextError

LANGUAGES = ("auto", "zh", "en")
_MANDARIN, _ENGLISH, _DIGIT, _NEUTRAL = "zh", "en", "digit", "neutral"
# A sentence ends after 。！？!?… , or after a "." before a space, a quote or the end (3.14 stays whole),
# taking any closing quotes and brackets with it; a line break ends one too.
_SENTENCE_END = re.compile(r"(?:[。！？!?…]+|\.(?=[\s”’\"')）]|$))[”’」』)）\"']*|\n+")
# Pieces shorter than this join the next one: the official pipeline does not speak 2-character sentences.
MIN_SENTENCE_CHARS = 5
# A sentence not ending in one of these gets an end mark, as the official pipeline appends one.
_SENTENCE_MARKS = "，。？！,.?!~:：—…"


@dataclass(frozen=True)
class LanguageSpan:
    language: str  # "zh" or "en"
    text: str


def fold_width(text: str) -> str:
    """Full-width ASCII (Ａ, １, ！) to its ASCII form; other characters as they are."""
    return "".join(unicodedata.normalize("NFKC", c) if "\uff01" <= c <= "\uff5e" else c for c in text)


def character_class(char: str) -> str | None:
    """zh, en, digit or neutral; None for a character of a script this front end does not speak."""
    if HANZI.match(char):
        return _MANDARIN
    if "0" <= char <= "9":
        return _DIGIT
    base = unicodedata.normalize("NFD", char)[0]
    if base.isascii() and base.isalpha():
        return _ENGLISH
    category = unicodedata.category(char)
    if category[0] in "PSZ" or category in ("Cc", "Cf"):
        return _NEUTRAL
    return None


def refuse_unspeakable(text: str, language: str) -> None:
    """Raise naming every character this front end cannot speak in ``language``."""
    bad: list[str] = []
    for char in text:
        kind = character_class(char)
        if (kind is None or (language == "en" and kind == _MANDARIN)) and char not in bad:
            bad.append(char)
    if bad:
        named = ", ".join(f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})" for c in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        speaks = "English (Latin letters)" if language == "en" else "Mandarin (hanzi) and English (Latin letters)"
        raise UnspeakableTextError(
            f"GPT-SoVITS v2 front end cannot speak {named}{more}: with language={language!r} it speaks {speaks}"
        )


def split_sentences(text: str) -> list[str]:
    """Sentences, each with its end mark; a piece under ``MIN_SENTENCE_CHARS`` joins the next."""
    pieces = []
    start = 0
    for end in _SENTENCE_END.finditer(text):
        pieces.append(text[start:end.end()].strip())
        start = end.end()
    pieces.append(text[start:].strip())
    pieces = [piece for piece in pieces if piece and any(character_class(c) != _NEUTRAL for c in piece)]
    sentences: list[str] = []
    pending = ""
    for piece in pieces:
        pending = f"{pending} {piece}".strip() if _needs_space(pending, piece) else pending + piece
        if len(pending) >= MIN_SENTENCE_CHARS:
            sentences.append(pending)
            pending = ""
    if pending:
        if sentences:
            sentences[-1] = f"{sentences[-1]} {pending}" if _needs_space(sentences[-1], pending) else sentences[-1] + pending
        else:
            sentences.append(pending)
    return sentences


def _needs_space(left: str, right: str) -> bool:
    return bool(left) and bool(right) and character_class(right[0]) in (_ENGLISH, _DIGIT)


def ensure_sentence_end(sentence: str, spans: list[LanguageSpan]) -> list[LanguageSpan]:
    """The official pipeline ends every sentence with a mark: 。 after Mandarin, . after English."""
    if not spans or sentence.rstrip()[-1:] in _SENTENCE_MARKS:
        return spans
    last = spans[-1]
    mark = "。" if last.language == _MANDARIN else "."
    return [*spans[:-1], LanguageSpan(last.language, last.text + mark)]


def split_languages(sentence: str, language: str) -> list[LanguageSpan]:
    """Runs of one language each; with language="en" the whole sentence is one English run.

    Digits are read in the language of the run before them (the one after, at the start); with
    language="zh" always in Mandarin, as the official "all_zh" mode does.
    """
    if language == "en":
        return [LanguageSpan(_ENGLISH, sentence)]
    runs: list[list] = []  # [kind, text]; digits and neutral marks are resolved below
    for char in sentence:
        kind = character_class(char)
        if runs and (runs[-1][0] == kind or kind == _NEUTRAL):
            runs[-1][1] += char
        else:
            runs.append([kind, char])
    spans: list[LanguageSpan] = []
    for index, (kind, text) in enumerate(runs):
        if kind == _DIGIT:
            kind = _MANDARIN if language == "zh" else spans[-1].language if spans else _next_language(runs, index)
        elif kind == _NEUTRAL:  # only a leading run of marks: it goes with what follows
            kind = _next_language(runs, index)
        if spans and spans[-1].language == kind:
            spans[-1] = LanguageSpan(kind, spans[-1].text + text)
        else:
            spans.append(LanguageSpan(kind, text))
    return spans


def _next_language(runs: list[list], index: int) -> str:
    """The first language after ``runs[index]``; Mandarin when only digits and marks follow."""
    following = [kind for kind, _ in runs[index + 1:] if kind in (_MANDARIN, _ENGLISH)]
    return following[0] if following else _MANDARIN
