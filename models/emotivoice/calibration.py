"""Prompt/text pairs for EmotiVoice's calibration: Mandarin and English sentences of our own
authoring, each with an emotion prompt, so that INT8 ranges and the vocoder students see mel
frames of every emotion rather than of the default 普通 alone.

    python -m compress model=emotivoice +experiment=debug_emotivoice_stages   # reads CALIBRATION_PAIRS

The file (models/emotivoice/data/calibration_pairs.tsv, columns ``text`` and ``prompt``) is what
``data.calibration_set`` names in EmotiVoice's experiments; ``texts.load_sentences`` reads its
``text`` column. It never holds evaluation text (the Harvard lists, texts/eval_sentences.txt).
A sentence outside the file (training text, say) takes the emotions in turn by a hash of its text.
"""
from __future__ import annotations

import csv
import zlib
from functools import lru_cache
from pathlib import Path

from models.emotivoice.prompts import DEFAULT_PROMPT, EMOTION_PROMPTS

CALIBRATION_PAIRS = Path(__file__).resolve().parent / "data" / "calibration_pairs.tsv"
# Each emotion once, by the prompt the style encoder reads (the Chinese word).
EMOTIONS = tuple(dict.fromkeys(EMOTION_PROMPTS.values()))


@lru_cache(maxsize=1)
def calibration_prompts() -> dict[str, str]:
    """text -> its emotion prompt, from CALIBRATION_PAIRS."""
    with CALIBRATION_PAIRS.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    unknown = sorted({row["prompt"] for row in rows} - set(EMOTIONS))
    if unknown:
        raise ValueError(f"{CALIBRATION_PAIRS}: prompts {unknown} are not emotions of the style encoder "
                         f"{list(EMOTIONS)}")
    return {row["text"].strip(): row["prompt"] for row in rows}


def prompt_for(text: str) -> str:
    """The sentence's paired prompt; otherwise an emotion chosen by a stable hash of the text
    (the same on every run and machine: crc32, not Python's salted ``hash``)."""
    paired = calibration_prompts().get(text.strip())
    if paired is not None:
        return paired
    return EMOTIONS[zlib.crc32(text.encode("utf-8")) % len(EMOTIONS)] if text else DEFAULT_PROMPT
