"""The text rule every family's text passes first (models/text/sanitize.py): NFKC, whitespace runs
read as one space, control and format characters refused with their code point and position.

    python -m pytest -q tests/models/test_sanitize.py
"""
from __future__ import annotations

import unicodedata

import pytest

from models.text.sanitize import UnsafeTextError, speakable_text


@pytest.mark.parametrize("text, codepoint, position", [
    ("hi \x00 there", "U+0000", 3),  # espeak-ng read it as the end: only "hi" was spoken
    ("Hello\x00world\x07", "U+0000", 5),
    ("ring \x07 the bell", "U+0007", 5),
    ("price \u202e01$", "U+202E", 6),  # right-to-left override: shows another text than it holds
    ("a\u200bb", "U+200B", 1),  # zero-width space
    ("\ufeffHello", "U+FEFF", 0),  # a byte-order mark inside the text
    ("hidden\U000e0041\U000e0042", "U+E0041", 6),  # tag characters smuggle invisible text
    ("private \ue000 use", "U+E000", 8),
    ("unit\x1fseparator", "U+001F", 4),  # str.isspace says yes; it is a control, not whitespace
    ("lone \ud800 surrogate", "U+D800", 5),  # json.loads gives this for the escape "\ud800"
])
def test_control_and_format_characters_are_refused_with_codepoint_and_position(text, codepoint, position):
    with pytest.raises(UnsafeTextError) as raised:
        speakable_text(text)
    assert raised.value.codepoint == codepoint and raised.value.position == position
    assert f"{codepoint}" in str(raised.value) and f"position {position}" in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_position_is_in_the_text_as_sent_not_the_normalized_one():
    # "ﬁ" (one character) becomes "fi" under NFKC and the tab run one space: the NUL is still at 8.
    with pytest.raises(UnsafeTextError) as raised:
        speakable_text("ﬁne\t\t\t x\x00")
    assert raised.value.position == 8


@pytest.mark.parametrize("text", [
    "Hello, world! Is it 3:45 p.m.? Yes; it's \"fine\" (mostly) - 100% [sure] {ok} <tag> & @ # / \\ * ~ ^ _",
    "Café naïve façade résumé Ærøskøbing Straße Dvořák",
    "こんにちは世界。你好，世界！안녕하세요",
    "Привет, мир. مرحبا بالعالم. שלום עולם",
    "Emoji: 😀 👍🏽 ❤️ 👨\u200d👩\u200d👧 🇫🇷",  # skin tone, variation selector, ZWJ family, flag
    "می\u200cخواهم",  # ZWNJ inside a Persian word
])
def test_ordinary_text_passes_unchanged_apart_from_nfkc(text):
    assert speakable_text(text) == unicodedata.normalize("NFKC", text)


def test_nfkc_and_whitespace_runs():
    assert speakable_text("ＡＢＣ ﬁ x²") == "ABC fi x2"  # full-width letters, ligature, superscript
    assert speakable_text("one\ttwo\n\nthree\r\nfour\u00a0\u00a0five\u2003six\u3000seven") == \
        "one two three four five six seven"
    assert speakable_text("  \n padded \t ") == "padded"
    assert speakable_text(" \t\n") == ""
