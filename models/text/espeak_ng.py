"""espeak-ng's IPA for a text, sentence by sentence, with the voice set once rather than on every call.

    espeak_sentences("Hello, world! Bye.", "en-us")   # -> [["h", "ə", ..., ",", " ", ..., "!"], ["b", ..., "."]]

The same phonemes as ``piper_phonemize.phonemize_espeak`` (tests/models/text/test_espeak_ng.py compares
them), without its leak: piper_phonemize calls ``espeak_SetVoiceByName`` on every call, and
espeak-ng (1.51, the one its wheel bundles) copies the voice into its synthesis command queue
(``DoVoiceChange``, a ``malloc`` of ``voice_t``) for the waveform generator to free, which a
text-to-phonemes call never runs. 1,360 bytes stay allocated per call, and the serving frontend
phonemizes each sentence with one call: 240 MiB of server memory over the 10-minute slow-client
soak of 2026-12-01 (docs/benchmarks.md).

Here espeak-ng is initialised by one piper_phonemize call (so its data path is piper_phonemize's),
then driven through ctypes on the same loaded library: the voice is set only when it changes, and
each clause comes from ``espeak_TextToPhonemesWithTerminator``, the call piper_phonemize's own
espeak-ng build adds. Sentences are built by piper_phonemize's rule: a clause's IPA in NFD
codepoints, language-switch flags like ``(fr)`` dropped, the clause's punctuation appended (``,``,
``:`` and ``;`` with a space), a new sentence after ``.``, ``?`` and ``!``. Where the library is not a
separate shared object (no ``libespeak-ng`` among the process's mappings after piper_phonemize is
imported), every call goes through piper_phonemize, leak included, and a warning says so once.

espeak-ng keeps one global state: every call here holds ``ESPEAK_LOCK``. Another caller of
piper_phonemize in the same process sets the voice behind this module's back; with a different
voice, the next call here would speak in it, so nothing else in this code base calls it.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import unicodedata
from pathlib import Path

log = logging.getLogger(__name__)

ESPEAK_LOCK = threading.Lock()

CHARS_AUTO = 0  # espeakCHARS_AUTO: UTF-8, else the voice's 8-bit set
PHONEMES_IPA = 0x02  # phoneme mode bit 1: IPA as UTF-8, no separator between phonemes
# Clause terminators (espeak-ng's translate.h): the pause in the low 20 bits, the clause type above.
CLAUSE_PUNCTUATION_MASK = 0x000FFFFF
CLAUSE_TYPE_SENTENCE = 0x00080000
CLAUSE_PUNCTUATION = {
    40 | 0x00000000 | CLAUSE_TYPE_SENTENCE: ["."],  # full stop
    40 | 0x00002000 | CLAUSE_TYPE_SENTENCE: ["?"],
    45 | 0x00003000 | CLAUSE_TYPE_SENTENCE: ["!"],
    20 | 0x00001000 | 0x00040000: [",", " "],  # comma, a clause
    30 | 0x00000000 | 0x00040000: [":", " "],
    30 | 0x00001000 | 0x00040000: [";", " "],
}
# piper_phonemize's per-voice phoneme rewrites: Brazilian Portuguese speaks espeak's "c" as "k".
VOICE_PHONEME_MAP = {"pt-br": {"c": ["k"]}}


class _Espeak:
    """The loaded library and the voice last set on it (None: not initialised yet)."""

    library: ctypes.CDLL | None = None
    voice: str | None = None
    direct = True  # False: the library is not reachable through ctypes; piper_phonemize does every call


def _loaded_espeak_library() -> Path | None:
    """The libespeak-ng shared object piper_phonemize's extension has loaded, from the process's mappings."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode[, path]
        if len(fields) == 6 and Path(fields[5]).name.startswith("libespeak-ng"):
            return Path(fields[5])
    return None


def _bind(library_path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(library_path))  # the same handle the extension holds: one espeak-ng state
    library.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    library.espeak_SetVoiceByName.restype = ctypes.c_int
    library.espeak_TextToPhonemesWithTerminator.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    library.espeak_TextToPhonemesWithTerminator.restype = ctypes.c_char_p
    return library


def _start(text: str, espeak_voice: str) -> list[list[str]]:
    """The first call: piper_phonemize initialises espeak-ng (its data path) and sets the voice."""
    # Imported on first use: engines that run from phoneme ids (the GPU benchmark) need no espeak-ng.
    from piper_phonemize import phonemize_espeak

    sentences = phonemize_espeak(text, espeak_voice)
    library_path = _loaded_espeak_library()
    if library_path is None or not hasattr(ctypes.CDLL(str(library_path)), "espeak_TextToPhonemesWithTerminator"):
        _Espeak.direct = False
        log.warning("espeak-ng is not a separate library here: phonemizing through piper_phonemize, which keeps "
                    "about 1.4 KB per call (models/text/espeak_ng.py)")
    else:
        _Espeak.library = _bind(library_path)
    _Espeak.voice = espeak_voice
    return sentences


def _clauses(library: ctypes.CDLL, text: str) -> list[tuple[str, int]]:
    """(IPA, terminator) of each clause of ``text``, as espeak-ng splits it."""
    # espeak-ng reads the text in place and never writes it, so it can read the bytes object's own NUL-ended
    # buffer (held by ``encoded`` until the loop ends). create_string_buffer would make a new ctypes array
    # type for each text length, and each type is a reference cycle left to the garbage collector.
    encoded = text.encode("utf-8")
    # espeak-ng moves ``position`` past each clause, to NULL at the end.
    position = ctypes.cast(ctypes.c_char_p(encoded), ctypes.c_void_p)
    clauses = []
    while position.value is not None:
        terminator = ctypes.c_int(0)
        ipa = library.espeak_TextToPhonemesWithTerminator(ctypes.byref(position), CHARS_AUTO, PHONEMES_IPA,
                                                          ctypes.byref(terminator))
        clauses.append(((ipa or b"").decode("utf-8"), terminator.value))
    return clauses


def _without_language_flags(phonemes: list[str]) -> list[str]:
    """``phonemes`` without espeak's language switches, ``(fr)`` ... ``(en)`` around foreign words' flags."""
    kept, in_flag = [], False
    for phoneme in phonemes:
        if in_flag:
            in_flag = phoneme != ")"
        elif phoneme == "(":
            in_flag = True
        else:
            kept.append(phoneme)
    return kept


def espeak_sentences(text: str, espeak_voice: str) -> list[list[str]]:
    """espeak-ng's IPA codepoints of ``text``, one list per sentence (with its punctuation), as
    ``piper_phonemize.phonemize_espeak(text, espeak_voice)`` returns them."""
    with ESPEAK_LOCK:
        if _Espeak.voice is None:
            return _start(text, espeak_voice)
        if not _Espeak.direct:
            from piper_phonemize import phonemize_espeak

            return phonemize_espeak(text, espeak_voice)
        library = _Espeak.library
        if espeak_voice != _Espeak.voice:
            if library.espeak_SetVoiceByName(espeak_voice.encode()) != 0:
                raise RuntimeError(f"espeak-ng has no voice {espeak_voice!r}: give an espeak-ng voice name, "
                                   "e.g. 'en-us' (a Piper voice's config names it under espeak.voice)")
            _Espeak.voice = espeak_voice
        clauses = _clauses(library, text)
    rewrites = VOICE_PHONEME_MAP.get(espeak_voice, {})
    sentences: list[list[str]] = []
    sentence: list[str] | None = None
    for ipa, terminator in clauses:
        if sentence is None:
            sentence = []
            sentences.append(sentence)
        phonemes = [mapped for phoneme in unicodedata.normalize("NFD", ipa)
                    for mapped in rewrites.get(phoneme, [phoneme])]
        sentence += _without_language_flags(phonemes)
        sentence += CLAUSE_PUNCTUATION.get(terminator & CLAUSE_PUNCTUATION_MASK, [])
        if terminator & CLAUSE_TYPE_SENTENCE:
            sentence = None
    return sentences
