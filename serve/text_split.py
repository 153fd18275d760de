"""Split request text into pieces of at most ``max_chars``, at the most natural break available.

Order of preference: sentence ends (. ! ? and full-width 。！？．, the ellipsis …), then clause marks
(, ; : and dashes, and full-width ，；：), then spaces, then, in text written without spaces, after a
Chinese or Japanese mark (。！？，；：、), then a hard cut (a single "word" longer than the cap). Each piece is phonemized on its own, so
one long input never becomes one unbounded batch item.

    split_text("One. Two, three four.", max_chars=12)  # -> ["One.", "Two,", "three four."]
"""
from __future__ import annotations

import re

# Full-width "！？．" and "，；：" count as their ASCII forms, the ideographic full stop "。" as ".", "…" as
# "...": the text rule keeps them as sent (models/text/sanitize.py). A break still needs the space after
# the mark (Chinese sentences a client joined with spaces are sentences apart), so unspaced Chinese
# text up to the cap stays whole for its frontend, which reads the marks as prosody; longer text is
# cut after a mark before it is cut anywhere.
_SENTENCE_END = re.compile(r"(?<=[.!?\u3002\uff01\uff1f\uff0e\u2026])\s+")
_CLAUSE_END = re.compile(r"(?<=[,;:\uff0c\uff1b\uff1a\u2014\u2013])\s+|\s+(?=[\u2014\u2013-]\s)")
_CJK_MARK_END = re.compile(r"(?<=[\u3002\uff01\uff1f\uff0c\uff1b\uff1a\u3001\uff61\uff64])")


def _pack(parts: list[str], max_chars: int, joiner: str = " ") -> list[str]:
    """Greedily join consecutive ``parts`` while the result stays within ``max_chars``."""
    pieces: list[str] = []
    for part in parts:
        if pieces and len(pieces[-1]) + len(joiner) + len(part) <= max_chars:
            pieces[-1] = pieces[-1] + joiner + part
        else:
            pieces.append(part)
    return pieces


def _split_long(text: str, max_chars: int) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    for pattern, joiner in ((_CLAUSE_END, " "), (re.compile(r"\s+"), " "), (_CJK_MARK_END, "")):
        parts = [p for p in pattern.split(text) if p.strip()]
        if len(parts) > 1:
            return [piece for part in _pack(parts, max_chars, joiner) for piece in _split_long(part, max_chars)]
    return [text[start:start + max_chars] for start in range(0, len(text), max_chars)]


def split_text(text: str, max_chars: int) -> list[str]:
    """Non-empty pieces of ``text`` in order, each at most ``max_chars`` characters long."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    sentences = [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    return [piece for sentence in sentences for piece in _split_long(sentence, max_chars)]
