"""espeak_sentences gives piper_phonemize's phonemes and keeps no memory per call (piper_phonemize keeps
1.4 KB per call: models/text/espeak_ng.py).

    python -m pytest -q tests/models/text/test_espeak_ng.py
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import piper_phonemize
import pytest

from models.text.espeak_ng import espeak_sentences

LINES = [
    "Could you leave the porch light on until midnight?",
    "Note: the ferry is cancelled. Take the bridge instead! Any questions?",
    "The 3 o'clock train leaves from platform 9; don't be late.",
    "Dr. Smith paid $3.50 for the café's crème brûlée... really?!",
    "He said \"bonjour\" and left, quickly; then: nothing",
    "Line one\nLine two.\n\nLine three!",
    "...",
    "",
]
VOICES = ["en-us", "pt-br", "de"]  # pt-br: piper_phonemize rewrites its "c"; de: a voice switch mid-process
CALLS = 20_000
ALLOWED_GROWTH_MIB = 4  # piper_phonemize's way: 26 MiB for these calls


def test_phonemes_equal_piper_phonemize():
    """Ours for every voice and line first (the voice switching as it goes), piper_phonemize's after."""
    ours = {(voice, line): espeak_sentences(line, voice) for voice in VOICES for line in LINES}
    for (voice, line), sentences in ours.items():
        assert sentences == piper_phonemize.phonemize_espeak(line, voice), (voice, line)


def test_unknown_voice_is_named():
    espeak_sentences("Warm up.", "en-us")
    with pytest.raises(RuntimeError, match="no-such-voice"):
        espeak_sentences("Hello.", "no-such-voice")
    assert espeak_sentences("Hello.", "en-us") == piper_phonemize.phonemize_espeak("Hello.", "en-us")


def resident_mib() -> float:
    """This process's resident memory once the C allocator has handed its free pages back."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def test_phonemizing_keeps_no_memory_per_call():
    sentence = "The lamp was lit at dusk."
    for _ in range(200):  # espeak-ng's dictionaries and buffers are in place
        espeak_sentences(sentence, "en-us")
    before_mib = resident_mib()
    for _ in range(CALLS):
        espeak_sentences(sentence, "en-us")
    grown_mib = resident_mib() - before_mib
    assert grown_mib < ALLOWED_GROWTH_MIB, f"{CALLS} calls kept {grown_mib:.1f} MiB"
