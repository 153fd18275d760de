"""Every family the toolkit knows, by the name configs use (``model.family``).

Adding a family: one folder (models/<family>/ with a ``family.py`` defining FAMILY), one config
(conf/model/<family>_<voice>.yaml), one line here, and it joins tests/families/test_contract.py.
"""
from __future__ import annotations

from models.family import Family
from models.emotivoice.family import FAMILY as EMOTIVOICE
from models.gpt_sovits.family import FAMILY as GPT_SOVITS_V2
from models.kokoro.family import FAMILY as KOKORO
from models.piper.family import FAMILY as PIPER

FAMILIES: dict[str, Family] = {family.name: family for family in (PIPER, EMOTIVOICE, GPT_SOVITS_V2, KOKORO)}


def get_family(name: str) -> Family:
    """The registered family ``name``; a ValueError lists the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; registered: {sorted(FAMILIES)}") from None


def family_of(model) -> Family:
    """The registered family of a loaded model (``model.family``)."""
    return get_family(model.family)
