"""What a reference clip contributes to every sentence of its voice, and how per-sentence outputs
become one padded result; shared by eager synthesis (voice.py) and token-step decoding."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.interface import SynthesisResult


@dataclass(frozen=True)
class Prompt:
    """What a reference clip contributes to every sentence spoken in its voice."""

    tokens: torch.Tensor  # (T_prompt,) int64 semantic tokens of the clip
    phoneme_ids: torch.Tensor  # (T_ref_text,) int64 phones of the transcript
    bert_features: torch.Tensor  # (1024, T_ref_text)
    spectrogram: torch.Tensor  # (1, bins, T_spec) linear spectrogram at the synthesizer's rate


def pad_results(waveforms: list[torch.Tensor], token_rows: list[torch.Tensor], sample_rate_hz: int) -> SynthesisResult:
    """Per-sentence waveforms and tokens -> one right-padded result."""
    lengths = torch.tensor([w.numel() for w in waveforms], dtype=torch.long)
    audio = torch.zeros(len(waveforms), int(lengths.max()))  # (B, T_audio)
    tokens = torch.zeros(len(token_rows), max(t.numel() for t in token_rows), dtype=torch.long)  # (B, T_tokens)
    for row, (waveform, row_tokens) in enumerate(zip(waveforms, token_rows)):
        audio[row, : waveform.numel()] = waveform.clamp(-1.0, 1.0)
        tokens[row, : row_tokens.numel()] = row_tokens
    return SynthesisResult(audio=audio, audio_lengths=lengths, sample_rate_hz=sample_rate_hz, tokens=tokens)
