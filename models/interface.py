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

import math
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

    ``draw`` gives the standard-normal tensors a model scales and consumes: from a seed (a CPU
    generator by default, identical on every device and engine; ``device=`` draws on that
    device's generator instead, identical across engines on that device), from explicit
    tensors, or from the global RNG when ``seed`` is None. Scales of 0 make synthesis deterministic.
    """

    noise_scale: float = 0.667  # prior noise; Piper's default
    length_scale: float = 1.0  # >1 speaks slower
    noise_scale_w: float = 0.8  # duration-predictor noise; Piper's default
    seed: int | None = 0
    duration_noise: torch.Tensor | None = None  # (B, 2, T_text)
    prior_noise: torch.Tensor | None = None  # (B, C_latent, T_frames_cap)
    # Frames one phoneme id may take at length_scale 1; bounds the prior noise drawn up front
    # because the frame count is only known after duration prediction.
    max_frames_per_phoneme_id: int = 16

    def draw(self, batch: int, text_length: int, latent_channels: int,
             device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(duration_noise (B, 2, T_text), prior_noise (B, C_latent, T_frames_cap)) on ``device``.

        Why a device: the prior noise is ~16 frames x 192 channels per phoneme, millions of draws
        for a batch; on a GPU engine drawing them on the host costs more than synthesis itself.
        Explicit tensors are moved to ``device`` as given.
        """
        if self.duration_noise is not None and self.prior_noise is not None:
            return self.duration_noise.to(device), self.prior_noise.to(device)
        generator = None if self.seed is None else torch.Generator(device=device).manual_seed(self.seed)
        frames_cap = int(math.ceil(text_length * self.max_frames_per_phoneme_id * max(1.0, self.length_scale)))
        duration_noise = torch.randn((batch, 2, text_length), generator=generator, device=device)
        prior_noise = torch.randn((batch, latent_channels, frames_cap), generator=generator, device=device)
        return duration_noise, prior_noise


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

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Swap the part playing ``role`` for a module with the same call signature."""
        ...
