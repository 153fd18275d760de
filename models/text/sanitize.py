"""The one rule every text a family speaks passes first, whatever the family and its frontend.

    text = speakable_text(client_text)  # NFKC (full-width punctuation kept), one space per whitespace run

Frontends hand text to C libraries (espeak-ng reads a NUL as the end of the string, so
"hi \\x00 there" spoke only "hi") and to tokenizers that treat invisible characters as content
(U+202E reverses what a reader sees; U+E0041... tags smuggle text nobody sees). So:

- Unicode NFKC first, so that compatibility forms (full-width letters and digits, ligatures,
  superscripts) reach the frontend as the letters they stand for: "Ａ１" -> "A1".
- But the punctuation of the Halfwidth and Fullwidth Forms block reaches the frontend as sent
  ("，" stays "，"; see KEPT_AS_SENT). The CJK Symbols and Punctuation block ("。" "、" "「」" "〜")
  needs no exemption: NFKC leaves its punctuation as it is.
- Every run of Unicode whitespace (the White_Space property: tabs, newlines, NBSP, the em and
  ideographic spaces...) becomes one space, and the text is trimmed at both ends.
- Any other control or format character is refused, never dropped: categories Cc (controls),
  Cf (format: bidi overrides, zero-width space, soft hyphen, BOM, tags), Cs (lone surrogates),
  Co (private use) and Cn (unassigned). ZWJ (U+200D) and ZWNJ (U+200C) stay: emoji sequences
  and Persian or Indic spelling need them. The error names the first such character as U+XXXX
  and its 0-based position in the text as sent.

NFKC never turns an accepted character into a refused one (checked over all of Unicode), so the
check runs on the text as sent and its positions are the client's.
"""
from __future__ import annotations

import re
import unicodedata

# The Unicode White_Space property. Python's str.isspace also counts U+001C..U+001F (file, group,
# record and unit separators): those are controls here and refused.
WHITESPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
              "\u2028\u2029\u202f\u205f\u3000")
_WHITESPACE_RUN = re.compile(f"[{re.escape(WHITESPACE)}]+")
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
JOINERS = frozenset({"\u200c", "\u200d"})  # ZWNJ, ZWJ: part of emoji sequences and of words in some scripts

# Punctuation (categories P*) of the Halfwidth and Fullwidth Forms block, U+FF00..U+FFEF: "，！？：；（）"
# and the rest of full-width ASCII punctuation, and the half-width CJK marks "｡｢｣､･". The families'
# Mandarin frontends read these as prosody marks, and NFKC would make them other characters: EmotiVoice
# writes the break sp3 for "，" inside a run of Chinese but sp1 for ",", which ends the run, and
# ends a sentence at "！？；" wherever they stand but at "!?;" only before a space; GPT-SoVITS drops
# "､" but reads its NFKC form "、" as a comma. Which forms a frontend folds is its own business
# (GPT-SoVITS folds full-width ASCII itself), as in the official frontends, which see the text as the
# client wrote it. The block's letters and digits still fold, so that "Ａ１" is read as the "A1" it
# stands for (EmotiVoice would drop a full-width letter met in a run of Chinese), and so do its math
# and currency symbols ("＋￥～", categories S*). Its word-like punctuation ("％＆＠＃＊", category Po) is
# kept with the rest of P*; frontends that read those as words (espeak) fold them themselves. The ideographic
# space U+3000 is whitespace and becomes one space like the others: both Mandarin frontends read it
# as a space. The ellipses "…" and "‥" are kept too: Chinese writes "……" where English writes "...",
# and GPT-SoVITS ends a sentence at "…" but at "." only before a space, a quote or the end.
KEPT_AS_SENT = frozenset(
    [chr(code) for code in range(0xFF00, 0xFFF0) if unicodedata.category(chr(code))[0] == "P"] + ["\u2025", "\u2026"])
# Runs of kept punctuation, captured: re.split puts them at the odd indices of its result.
_KEPT_RUN = re.compile(f"([{re.escape(''.join(sorted(KEPT_AS_SENT)))}]+)")


class UnsafeTextError(ValueError):
    """Text holding a control or format character; ``codepoint`` and ``position`` say which and where."""

    def __init__(self, character: str, position: int):
        self.codepoint = f"U+{ord(character):04X}"
        self.position = position
        category = unicodedata.category(character)
        name = unicodedata.name(character, "")
        described = f"{self.codepoint} {name}" if name else self.codepoint
        super().__init__(f"character {described} (category {category}) at position {position} is a control or "
                         "format character; send printable text (spaces, tabs and newlines are fine)")


def first_unsafe_character(text: str) -> tuple[int, str] | None:
    """(0-based position, character) of the first character ``speakable_text`` refuses, or None."""
    for position, character in enumerate(text):
        if (character not in JOINERS and character not in WHITESPACE
                and unicodedata.category(character) in REFUSED_CATEGORIES):
            return position, character
    return None


def refuse_unsafe_characters(text: str) -> str:
    """``text`` unchanged, or ``UnsafeTextError`` for its first control or format character.

    What a family's frontend applies itself: the refusal, not the normalization, so that text
    given to the frontend directly is read as the official frontend reads it.
    """
    unsafe = first_unsafe_character(text)
    if unsafe is not None:
        position, character = unsafe
        raise UnsafeTextError(character, position)
    return text


def nfkc_but_kept_punctuation(text: str) -> str:
    """NFKC of ``text`` with every character of ``KEPT_AS_SENT`` left as it is.

    The same as NFKC of the whole text apart from those characters: each is a starter (combining
    class 0) that composes with nothing, so no composition or reordering crosses it.
    """
    parts = _KEPT_RUN.split(text)
    return "".join(part if index % 2 else unicodedata.normalize("NFKC", part) for index, part in enumerate(parts))


def fold_kept_punctuation(text: str) -> str:
    """``text`` with each character of ``KEPT_AS_SENT`` replaced by its NFKC form ("，" -> ",").

    For frontends of languages that do not write full-width punctuation: espeak-ng's English voice
    reads "，" as no pause at all and drops the space after it, where "," is a pause.
    """
    return _KEPT_RUN.sub(lambda run: unicodedata.normalize("NFKC", run.group(0)), text)


def speakable_text(text: str) -> str:
    """``text`` under the rule above; raises ``UnsafeTextError`` for a control or format character."""
    refuse_unsafe_characters(text)
    return _WHITESPACE_RUN.sub(" ", nfkc_but_kept_punctuation(text)).strip(" ")
