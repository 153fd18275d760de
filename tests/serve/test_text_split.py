"""How the server cuts request text into pieces (serve/text_split.py).

    python -m pytest -q tests/serve/test_text_split.py
"""
from __future__ import annotations

import pytest

from serve.text_split import split_text


def test_sentences_then_clauses_then_spaces():
    assert split_text("One. Two, three four.", max_chars=12) == ["One.", "Two,", "three four."]
    assert split_text("Short one! And a question? Yes.", max_chars=100) == ["Short one!", "And a question?", "Yes."]


def test_full_width_marks_break_like_their_ascii_forms():
    assert split_text("Hello！ How are you？ Fine.", max_chars=100) == ["Hello！", "How are you？", "Fine."]
    assert split_text("first part， second part； third", max_chars=14) == ["first part，", "second part；", "third"]


def test_unspaced_chinese_stays_whole_for_its_frontend():
    text = "今天天气很好，我们去公园吧！你呢？"
    assert split_text(text, max_chars=100) == [text]


def test_chinese_sentences_joined_with_spaces_split_at_each_full_stop():
    text = "今天天气很好。 我们去公园吧！ 你呢？"
    assert split_text(text, max_chars=100) == ["今天天气很好。", "我们去公园吧！", "你呢？"]
    assert split_text("今天天气很好。我们去公园吧！", max_chars=100) == ["今天天气很好。我们去公园吧！"]


def test_an_ellipsis_and_a_full_width_stop_end_sentences():
    assert split_text("Wait… What？ Go． Now", max_chars=100) == ["Wait…", "What？", "Go．", "Now"]


def test_long_unspaced_chinese_is_cut_after_a_mark_not_mid_word():
    text = "今天天气很好，我们去公园吧！你呢？"  # 17 characters, marks after the 6th, 13th and 17th
    assert split_text(text, max_chars=14) == ["今天天气很好，我们去公园吧！", "你呢？"]
    assert split_text(text, max_chars=8) == ["今天天气很好，", "我们去公园吧！", "你呢？"]


def test_a_word_longer_than_the_cap_is_cut_hard():
    assert split_text("abcdefghij", max_chars=4) == ["abcd", "efgh", "ij"]


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max_chars"):
        split_text("text", max_chars=0)
