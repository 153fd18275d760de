"""The one interface every TTS family implements, so stages and the server never touch internals.

A family (Piper/VITS now; EmotiVoice, GPT-SoVITS and Kokoro later) provides:

* a text frontend: ``text -> list[PhonemeSequence]`` (one per sentence);
* ``synthesize(SynthesisRequest) -> SynthesisResult`` on padded batches;
* named replaceable parts (``parts()``): the encoder, the duration/alignment model and the
  decoder/vocoder, which compression stages prune, quantize, distil or swap.

Conditioning that only some families use is optional on the request: a speaker id (Piper
multi-speaker, EmotiVoice), a reference embedding (GPT-SoVITS zero-shot clip, resemblyzer-style
d-vectors), a style vector or prompt embedding (Kokoro's 256-d style, EmotiVoice's BERT prompt).
A model rejects conditioning it cannot use with a ValueError rather than ignoring it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class PhonemeSequence:
    """One sentence after the text frontend."""

    text: str
    phonemes: tuple[str, ...]
    phoneme_ids: tuple[int, ...]


@dataclass(frozen=True)
class NoiseControl:
    """Everything random about synthesis, made explicit so two variants compare sample for sample.

    Either give a seed (a CPU ``torch.Generator`` draws the noise, identical on every device)
    or explicit tensors. Scales of 0 make synthesis deterministic.
    """

    noise_scale: float = 0.667  # prior noise; Piper's default
    length_scale: float = 1.0  # >1 speaks slower
    noise_scale_w: float = 0.8  # duration-predictor noise; Piper's default
    seed: int | None = 0
    duration_noise: torch.Tensor | None = None  # (B, 2, T_text), standard normal
    prior_noise: torch.Tensor | None = None  # (B, C_latent, T_frames_max), standard normal

    def generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device="cpu").manual_seed(self.seed)


@dataclass
class SynthesisRequest:
    """A padded batch of phoneme ids plus optional conditioning."""

    phoneme_ids: torch.Tensor  # (B, T_text) int64, right-padded
    phoneme_lengths: torch.Tensor  # (B,) int64
    noise: NoiseControl = field(default_factory=NoiseControl)
    speaker_id: torch.Tensor | None = None  # (B,) int64
    reference_embedding: torch.Tensor | None = None  # (B, D_ref) float, zero-shot voices
    style: torch.Tensor | None = None  # (B, D_style) float, style vector / prompt embedding

    @classmethod
    def from_sequences(cls, sequences: list[PhonemeSequence], **kwargs) -> "SynthesisRequest":
        if not sequences:
            raise ValueError("SynthesisRequest needs at least one phoneme sequence, got none")
        lengths = torch.tensor([len(s.phoneme_ids) for s in sequences], dtype=torch.long)
        ids = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long)  # (B, T_text)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq.phoneme_ids)] = torch.tensor(seq.phoneme_ids, dtype=torch.long)
        return cls(phoneme_ids=ids, phoneme_lengths=lengths, **kwargs)


@dataclass
class SynthesisResult:
    audio: torch.Tensor  # (B, T_audio) float in [-1, 1], right-padded
    audio_lengths: torch.Tensor  # (B,) int64 samples
    durations: torch.Tensor  # (B, T_text) int64 frames per phoneme
    sample_rate_hz: int

    def waveforms(self) -> list[torch.Tensor]:
        """Unpadded waveforms, one (T_audio_i,) tensor per batch item."""
        return [self.audio[i, : int(n)] for i, n in enumerate(self.audio_lengths)]


@runtime_checkable
class TTSModel(Protocol):
    """What compression stages, evaluation and serving rely on."""

    sample_rate_hz: int

    def text_to_sequences(self, text: str) -> list[PhonemeSequence]: ...

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult: ...

    def parts(self) -> dict[str, nn.Module]:
        """Replaceable parts by role: ``encoder``, ``duration``, ``decoder`` (and ``flow`` for VITS)."""
        ...
