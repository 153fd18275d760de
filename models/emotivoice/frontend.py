"""EmotiVoice's text front end: Mandarin, English or mixed text -> sentences -> the voice's token ids.

Token ids are 0-based line numbers of the voice's ``tokenlist`` (official: data/youdao/text/tokenlist,
502 lines, id 0 ``_``, id 1 ``<sos/eos>``). Each sentence is ``<sos/eos> ... <sos/eos>``; a switch
from English to Mandarin inserts ``eng_cn_sp``; digits are read in Chinese when the text has Han
characters and in English otherwise (the official policy).

    frontend = EmotiVoiceFrontend.from_files(Path("data/youdao/text/tokenlist"), lexicon_path)
    frontend("今天天气很好。Let's go!")  # [Utterance(...), Utterance(...)]
"""
from __future__ import annotations

import re
from pathlib import Path

from models.emotivoice.english import EnglishG2p, read_lexicon
from models.emotivoice.mandarin import load_dictionaries, mandarin_phonemes, numbers_to_chinese
from models.interface import UnspeakableTextError, Utterance
from models.text.sanitize import refuse_unsafe_characters

BOUNDARY = "<sos/eos>"
ENGLISH_TO_MANDARIN = "eng_cn_sp"
HAN = re.compile(r"[\u4e00-\u9fff]")
# A Mandarin run: Han characters, CJK and full-width punctuation, and digits (already in Chinese
# when the text has Han characters).
MANDARIN_RUN = re.compile(r"([\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]+)")
# Sentence ends: CJK stops anywhere, ASCII ones before a space or the end (not the dot of 3.5).
SENTENCE_END = re.compile(r"(?<=[。！？；])|(?<=[.!?;])(?=\s|$)")


def read_tokenlist(path: Path) -> list[str]:
    """One symbol per line; its 0-based line number is its id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenlist {path} not found: the official one is data/youdao/text/tokenlist")
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle]


def split_sentences(text: str) -> list[str]:
    return [sentence.strip() for sentence in SENTENCE_END.split(text) if sentence and sentence.strip()]


def _is_pause(symbol: str) -> bool:
    return "sp" in symbol and symbol != BOUNDARY


class EmotiVoiceFrontend:
    def __init__(self, tokens: list[str], lexicon: dict[str, tuple[str, ...]]):
        self.tokens = tuple(tokens)
        self.token_ids = {token: index for index, token in enumerate(tokens)}
        if BOUNDARY not in self.token_ids:
            raise ValueError(f"tokenlist has no {BOUNDARY!r}: not an EmotiVoice tokenlist")
        self.english = EnglishG2p(lexicon)
        load_dictionaries()

    @classmethod
    def from_files(cls, tokenlist_path: Path, lexicon_path: Path | None = None) -> "EmotiVoiceFrontend":
        """The official tokenlist and, if given, the lexicon (lexicon/librispeech-lexicon.txt)."""
        return cls(read_tokenlist(tokenlist_path), read_lexicon(lexicon_path) if lexicon_path else {})

    def phonemes(self, sentence: str) -> list[str]:
        """Symbols of one sentence, ``<sos/eos>`` at both ends, no trailing pause."""
        if HAN.search(sentence):
            sentence = numbers_to_chinese(sentence)
        symbols: list[str] = []
        language = ""
        for run in MANDARIN_RUN.split(sentence):
            if not run.strip():
                continue
            if MANDARIN_RUN.fullmatch(run):
                phones = mandarin_phonemes(run)
                if phones and language == "en":
                    while symbols and _is_pause(symbols[-1]):
                        symbols.pop()
                    symbols.append(ENGLISH_TO_MANDARIN)
                run_language = "cn"
            else:
                phones = self.english.phonemes(run)
                run_language = "en"
            if phones:
                symbols += phones
                language = run_language
        while symbols and _is_pause(symbols[-1]):
            symbols.pop()
        return [BOUNDARY, *symbols, BOUNDARY] if symbols else []

    def __call__(self, text: str) -> list[Utterance]:
        text = refuse_unsafe_characters(text)  # models/text/sanitize.py: refused, never cut
        utterances = []
        for sentence in split_sentences(text):
            phonemes = self.phonemes(sentence)
            if not phonemes:
                continue
            unknown = sorted({symbol for symbol in phonemes if symbol not in self.token_ids})
            if unknown:
                raise UnspeakableTextError(f"sentence {sentence!r}: symbols {unknown} are not in this voice's "
                                           f"tokenlist ({len(self.tokens)} symbols)")
            utterances.append(Utterance(sentence, tuple(phonemes), tuple(self.token_ids[p] for p in phonemes)))
        if not utterances:
            raise UnspeakableTextError(f"text {text!r} has nothing this voice can speak: it takes Mandarin "
                                       "(Han characters) and English (Latin letters, digits)")
        return utterances
