"""The one rule every text a family speaks passes first, whatever the family and its frontend.

    text = speakable_text(client_text)     # NFKC, one space per whitespace run, or UnsafeTextError

Frontends hand text to C libraries (espeak-ng reads a NUL as the end of the string, so
"hi \\x00 there" spoke only "hi") and to tokenizers that treat invisible characters as content
(U+202E reverses what a reader sees; U+E0041... tags smuggle text nobody sees). So:

- Unicode NFKC first, so that compatibility forms (full-width letters, ligatures, superscripts)
  reach the frontend as the letters they stand for.
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

    What a family's frontend applies itself: the refusal, not the normalization, because NFKC
    folds full-width punctuation ("，" -> ",") that Mandarin frontends read as prosody breaks.
    """
    unsafe = first_unsafe_character(text)
    if unsafe is not None:
        position, character = unsafe
        raise UnsafeTextError(character, position)
    return text


def speakable_text(text: str) -> str:
    """``text`` under the rule above; raises ``UnsafeTextError`` for a control or format character."""
    refuse_unsafe_characters(text)
    return _WHITESPACE_RUN.sub(" ", unicodedata.normalize("NFKC", text)).strip(" ")
