"""English text normalisation of the v2 front end: numbers, money, times and symbols to words.

What is read how follows the official v2 English front end: years between 1001 and 2999 are read in
pairs ("nineteen eighty-four", "two thousand five"), other integers in full without "and", decimals digit
by digit after "point", a/b as a fraction, 24-hour times with a.m./p.m., and a capital inside a word
starts a new word, so acronyms are spelled ("GPT" -> "G P T"). Anything left that is not a letter,
an apostrophe or one of ``. , ? ! -`` is dropped.
"""
from __future__ import annotations

import functools
import re
import unicodedata

import inflect

# Only the CJK sentence ends are mapped: the official table also lists ; : and quotes, but as escaped
# regex text that never matches, so in the official output (and the models' training data) colons
# stay (12:30 is read as a time) and semicolons and quotes are dropped. We keep that behaviour.
_PUNCTUATION_TO_ASCII = str.maketrans({"。": ".", "！": "!", "？": "?"})
_LIST_NUMBER = re.compile(r"\b([0-9]+)\. ")  # "1. item" reads "first, item"
_SPACED_OPERATOR = re.compile(r"(\d+(?:\.\d+)?|[A-Za-z])\s+([+\-×÷=])\s+(\d+(?:\.\d+)?|[A-Za-z])")
_OPERATOR_WORDS = {"+": "plus", "-": "minus", "×": "times", "÷": "divided by", "=": "equals"}
_NEGATIVE = re.compile(r"(?:^|(?<=\s))-(\d+)")
_THOUSANDS_COMMAS = re.compile(r"([0-9][0-9,]+[0-9])")
_TIME = re.compile(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b")
_POUNDS = re.compile(r"£([0-9.,]*[0-9]+)|([0-9.,]*[0-9]+)£")
_DOLLARS = re.compile(r"\$([0-9.,]*[0-9]+)|([0-9.,]*[0-9]+)\$")
_DECIMAL = re.compile(r"([0-9]+)\.\s*([0-9]+)")
_FRACTION = re.compile(r"([0-9]+)/([0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(?:st|nd|rd|th)")
_INTEGER = re.compile(r"[0-9]+")
_NOT_SPOKEN = re.compile(r"[^ A-Za-z'.,?!\-]")
_CAPITAL_INSIDE_WORD = re.compile(r"(?<!^)(?<!\s)([A-Z])")
# A mark right after a space or another mark is dropped, so "Hi , there..." speaks one pause per break.
_REPEATED_PUNCTUATION = re.compile(r"([!?…,.\-\s])([!?…,.\-])+")


@functools.cache
def _inflect_engine() -> inflect.engine:
    return inflect.engine()


def normalize_english(text: str) -> str:
    """``"I paid $3.50 at 13:30"`` -> ``"I paid three dollars and fifty cents at one thirty p.m."``."""
    text = text.translate(_PUNCTUATION_TO_ASCII)
    text = _LIST_NUMBER.sub(lambda m: _inflect_engine().ordinal(m.group(1)) + ", ", text)
    while _SPACED_OPERATOR.search(text):
        text = _SPACED_OPERATOR.sub(lambda m: f"{m.group(1)} {_OPERATOR_WORDS[m.group(2)]} {m.group(3)}", text)
    text = _NEGATIVE.sub(r"negative \1", text)
    text = _THOUSANDS_COMMAS.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _TIME.sub(_read_time, text)
    text = _POUNDS.sub(lambda m: _read_money(m.group(1) or m.group(2), ("pound", "pounds"), ("penny", "pence")), text)
    text = _DOLLARS.sub(lambda m: _read_money(m.group(1) or m.group(2), ("dollar", "dollars"), ("cent", "cents")), text)
    text = _DECIMAL.sub(lambda m: f"{m.group(1)} point {' '.join(m.group(2))}", text)
    text = _FRACTION.sub(_read_fraction, text)
    text = _ORDINAL.sub(lambda m: _inflect_engine().number_to_words(m.group(0)), text)
    text = _INTEGER.sub(lambda m: read_integer(int(m.group(0))), text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = _NOT_SPOKEN.sub("", text)
    text = re.sub(r"(?i)i\.e\.", "that is", text)
    text = re.sub(r"(?i)e\.g\.", "for example", text)
    text = _CAPITAL_INSIDE_WORD.sub(r" \1", text)
    return _REPEATED_PUNCTUATION.sub(r"\1", text)


def read_integer(number: int) -> str:
    """1984 -> "nineteen eighty-four", 2005 -> "two thousand five", 123 -> "one hundred twenty-three"."""
    engine = _inflect_engine()
    if 1000 < number < 3000:  # read as a year
        if number == 2000:
            return "two thousand"
        if 2000 < number < 2010:
            return "two thousand " + engine.number_to_words(number % 100)
        if number % 100 == 0:
            return engine.number_to_words(number // 100) + " hundred"
        return engine.number_to_words(number, andword="", zero="oh", group=2).replace(", ", " ")
    return engine.number_to_words(number, andword="")


def _read_time(match: re.Match) -> str:
    hours, minutes = int(match.group(1)), int(match.group(2))
    period = "a.m." if hours < 12 else "p.m."
    hours = hours - 12 if hours > 12 else hours
    hour_words = _inflect_engine().number_to_words(hours)
    if minutes == 0:
        return f"{hour_words} o'clock {period}"
    return f"{hour_words} {_inflect_engine().number_to_words(minutes)} {period}"


def _read_money(amount: str, units: tuple[str, str], subunits: tuple[str, str]) -> str:
    parts = amount.split(".")
    if len(parts) > 2:
        return f"{amount} {units[1]}"
    whole = int(parts[0].replace(",", "")) if parts[0] else 0
    fraction = int(parts[1].ljust(2, "0")[:2]) if len(parts) > 1 and parts[1] else 0
    whole_words = f"{whole} {units[0] if whole == 1 else units[1]}"
    fraction_words = f"{fraction} {subunits[0] if fraction == 1 else subunits[1]}"
    if whole and fraction:
        return f"{whole_words} and {fraction_words}"
    if fraction:
        return fraction_words
    return whole_words if whole else f"zero {units[1]}"


def _read_fraction(match: re.Match) -> str:
    numerator, denominator = int(match.group(1)), int(match.group(2))
    engine = _inflect_engine()
    numerator_words = engine.number_to_words(numerator)
    if denominator == 1:
        return numerator_words
    if denominator == 2:
        return f"{numerator_words} {'half' if numerator == 1 else 'halves'}"
    denominator_words = engine.ordinal(engine.number_to_words(denominator))
    return f"{numerator_words} {denominator_words}{'s' if numerator > 1 else ''}"
