"""The project's sentence sets: held-out evaluation, calibration, Harvard, and any file.

    from texts import load_sentences, phoneme_coverage
    eval_sentences = load_sentences("eval")

Never train or calibrate on ``eval``, ``eval_ja``, ``eval_zh`` or ``harvard``: they measure what a
compressed voice lost.
See texts/README.md for what each set is and where it came from.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotation: importing models pulls in torch, which a text tool need not
    from models.interface import Utterance

TEXTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TEXTS_DIR.parent
# The Harvard lists are shared data beside the checkout, not part of the repository.
HARVARD_PATH = REPO_ROOT.parent / "shared" / "data" / "harvard_sentences_lists01-36.tsv"
NAMED_SETS = {
    "eval": TEXTS_DIR / "eval_sentences.txt",
    "calibration": TEXTS_DIR / "calibration_sentences.txt",
    "harvard": HARVARD_PATH,
    # Japanese voices' sets (texts/README.md): the same roles as eval and calibration.
    "eval_ja": TEXTS_DIR / "eval_sentences_ja.txt",
    "calibration_ja": TEXTS_DIR / "calibration_sentences_ja.txt",
    # Mandarin held-out sentences of about 15 characters: what the EmotiVoice load tests speak (texts/README.md).
    "eval_zh": TEXTS_DIR / "eval_sentences_zh.txt",
}


# What each named set is written in (BCP 47): a recognizer transcribes a voice reading it in this language.
SET_LANGUAGES = {"eval": "en", "calibration": "en", "harvard": "en", "eval_ja": "ja", "calibration_ja": "ja",
                 "eval_zh": "zh"}


def set_language(name_or_path: str) -> str | None:
    """The language a named set is written in; None for a file, whose language only its author knows."""
    return SET_LANGUAGES.get(name_or_path)


def load_sentences(name_or_path: str) -> list[str]:
    """A named set (eval, calibration, harvard, eval_ja, calibration_ja, eval_zh), or a .txt (one sentence a
    line) or .tsv (column ``text``)."""
    path = NAMED_SETS.get(name_or_path) or Path(name_or_path)
    if path.suffix not in (".txt", ".tsv"):
        raise ValueError(
            f"unknown sentence set {name_or_path!r}: give one of {sorted(NAMED_SETS)} "
            "or a path to a .txt (one sentence a line) or .tsv (column 'text')"
        )
    if not path.is_file():
        where = " (the Harvard lists live in ../shared/data beside the repository)"
        raise FileNotFoundError(
            f"sentence set {name_or_path!r}: no file at {path}{where if name_or_path == 'harvard' else ''}"
        )
    sentences = _read_tsv(path) if path.suffix == ".tsv" else _read_txt(path)
    if not sentences:
        raise ValueError(f"sentence set {name_or_path!r} ({path}) holds no sentences")
    return sentences


def _read_txt(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _read_tsv(path: Path) -> list[str]:
    with path.open(encoding="utf-8", newline="") as tsv_file:
        rows = csv.DictReader(tsv_file, delimiter="\t")
        if "text" not in (rows.fieldnames or []):
            raise ValueError(f"{path} has no 'text' column (columns: {rows.fieldnames})")
        return [row["text"].strip() for row in rows if row["text"] and row["text"].strip()]


def normalize(sentence: str) -> str:
    """Lower case, punctuation dropped: two sentences that differ only in commas count as one."""
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", sentence.lower()).split())


def phoneme_coverage(
    sentences: Iterable[str], frontend: Callable[[str], list[Utterance]]
) -> set[str]:
    """Every symbol the frontend emits for these sentences (phonemes, stress, length, pauses)."""
    return {
        phoneme
        for sentence in sentences
        for sequence in frontend(sentence)
        for phoneme in sequence.phonemes
    }
