"""The GPT-SoVITS v2 text front end (Mandarin and English): ``text_to_phones`` and the v2 symbols."""
from models.gpt_sovits.text.frontend import (
    LanguageRun,
    PhonemizedSentence,
    text_to_phones,
)
from models.gpt_sovits.text.symbols import (
    SYMBOL_TO_ID,
    SYMBOLS,
    VOCABULARY_SIZE,
    phones_to_ids,
)

__all__ = [
    "SYMBOLS",
    "SYMBOL_TO_ID",
    "VOCABULARY_SIZE",
    "LanguageRun",
    "PhonemizedSentence",
    "phones_to_ids",
    "text_to_phones",
]
