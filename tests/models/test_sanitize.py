"""The text rule every family's text passes first (models/text/sanitize.py): NFKC but for the
punctuation of the Halfwidth and Fullwidth Forms block, whitespace runs read as one space, control
and format characters refused with their code point and position.

    python -m pytest -q tests/models/test_sanitize.py
"""
from __future__ import annotations

import unicodedata

import pytest

from models.text.sanitize import (
    KEPT_AS_SENT,
    WHITESPACE,
    UnsafeTextError,
    first_unsafe_character,
    nfkc_but_kept_punctuation,
    speakable_text,
)

CJK_SYMBOLS_AND_PUNCTUATION = range(0x3000, 0x3040)
HALFWIDTH_AND_FULLWIDTH_FORMS = range(0xFF00, 0xFFF0)


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
    ("你好，\x00世界", "U+0000", 3),  # after kept full-width punctuation
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
    "こんにちは世界。안녕하세요",
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


def test_full_width_letters_and_digits_fold_but_full_width_punctuation_stays():
    assert speakable_text("Ａ１，") == "A1，"
    assert speakable_text("ＡＢＣ，ｄｅｆ！１２３？") == "ABC，def！123？"
    assert speakable_text("＋￥～") == "+¥~"  # symbols of the block fold: no frontend reads them apart


@pytest.mark.parametrize("text", [
    "今天天气很好，我们去公园吧。",  # EmotiVoice reads "，" as sp3, "," as sp1
    "他说：「你好」；（真的）？好！",
    "你好｡再见､好｢吗｣･",  # half-width CJK marks: GPT-SoVITS reads "､" (dropped) apart from "、" (a comma)
    "Mandarin and English：mixed，fine！",
    "你好……世界‥",  # NFKC would write "......", where GPT-SoVITS ends no sentence
])
def test_cjk_punctuation_reaches_the_frontend_as_sent(text):
    assert speakable_text(text) == text


def test_the_kept_characters_are_the_punctuation_of_the_full_width_block_and_the_ellipses():
    assert len(KEPT_AS_SENT) == 32
    assert set("！＂＃％＆＇（）＊，－．／：；？＠［＼］＿｛｝｟｠｡｢｣､･…‥") == KEPT_AS_SENT
    assert all(unicodedata.normalize("NFKC", character) != character for character in KEPT_AS_SENT)


@pytest.mark.parametrize("block", [CJK_SYMBOLS_AND_PUNCTUATION, HALFWIDTH_AND_FULLWIDTH_FORMS])
def test_the_cjk_blocks_are_nfkc_apart_from_their_punctuation(block):
    for code in block:
        text = f"a{chr(code)}b"
        if first_unsafe_character(text) is not None:
            continue  # unassigned code points are refused
        expected = text if chr(code) in KEPT_AS_SENT else unicodedata.normalize("NFKC", text)
        assert speakable_text(text) == expected, f"U+{code:04X}"
        if unicodedata.category(chr(code))[0] == "P":
            assert speakable_text(text) == text, f"U+{code:04X}: punctuation of these blocks is never folded"


def test_ideographic_space_is_whitespace_like_the_others():
    assert "\u3000" in WHITESPACE
    assert speakable_text("\u3000你好\u3000\u3000世界，\u3000再见\u3000") == "你好 世界， 再见"


def test_keeping_punctuation_changes_nothing_else_than_nfkc_of_the_whole_text():
    # Each kept character is a starter that composes with nothing: NFKC of the pieces between
    # them is NFKC of the whole, next to combining marks and Hangul jamo too.
    fold = str.maketrans({character: unicodedata.normalize("NFKC", character) for character in KEPT_AS_SENT})
    neighbours = [chr(code) for code in range(0x110000)
                  if unicodedata.combining(chr(code)) or 0x1100 <= code <= 0x11FF]
    for kept in sorted(KEPT_AS_SENT):
        for neighbour in neighbours:
            text = f"{neighbour}{kept}{neighbour}"
            assert nfkc_but_kept_punctuation(text).translate(fold) == unicodedata.normalize("NFKC", text), \
                (f"U+{ord(kept):04X}", f"U+{ord(neighbour):04X}")


def test_normalizing_never_makes_an_accepted_character_a_refused_one():
    for code in range(0x110000):
        character = chr(code)
        if first_unsafe_character(character) is None:
            assert first_unsafe_character(speakable_text(character)) is None, f"U+{code:04X}"
