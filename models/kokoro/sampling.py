"""How Kokoro samples: its only randomness is the harmonic source's (SineGen's initial overtone
phases and additive noise), drawn from the seed per sentence so a batch equals its items alone.

The additive noise is one value per output sample and harmonic, but the sample count is known only
after the durations are predicted; so each sentence draws it for a cap of ``max_frames_per_token``
frames per phoneme id (pads included), the same whether it runs in PyTorch or as a graph, and the
decoder cuts it to the frames it makes (models/kokoro/decoder.py ``samples_of``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.kokoro.decoder import HARMONICS, SourceNoise
from models.sampling import Sampling


@dataclass(frozen=True)
class KokoroSampling(Sampling):
    # Scales both SineGen draws: 1 is the official KModel, 0 the shipped int8 graph (no noise).
    noise_scale: float = 1.0
    # Frames one phoneme id may take on average at length_scale 1 before the noise runs out (past the
    # cap a sentence's source has no noise); Kokoro's ids average a few frames, its pauses tens.
    max_frames_per_token: int = 16

    @classmethod
    def deterministic(cls, **values) -> KokoroSampling:
        return cls(**{"noise_scale": 0.0, **values})

    def __post_init__(self):
        if self.noise_scale < 0:
            raise ValueError(f"noise_scale={self.noise_scale}: use a value >= 0 (0 turns the source noise off)")
        if self.max_frames_per_token < 1:
            raise ValueError(f"max_frames_per_token={self.max_frames_per_token}: use an integer >= 1")

    def noise_samples(self, phoneme_count: int, samples_per_frame: int) -> int:
        """Samples of additive noise a sentence of ``phoneme_count`` ids (pads included) draws."""
        frames = phoneme_count * math.ceil(self.max_frames_per_token * max(1.0, self.length_scale))
        return frames * samples_per_frame

    def source_noise(self, phoneme_lengths: torch.Tensor, samples_per_frame: int) -> SourceNoise:
        """(initial phase (B, HARMONICS), additive (B, L_cap, HARMONICS)), scaled by noise_scale:
        each sentence drawn alone from the seed (a CPU generator), zero past its own cap."""
        caps = [self.noise_samples(int(length), samples_per_frame) for length in phoneme_lengths]
        initial_phase = torch.zeros(len(caps), HARMONICS)
        additive = torch.zeros(len(caps), max(caps), HARMONICS)
        for row, cap in enumerate(caps):
            generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
            drawn = SourceNoise.draw(1, cap, generator)
            initial_phase[row], additive[row, :cap] = drawn.initial_phase[0], drawn.additive[0]
        return SourceNoise(self.noise_scale * initial_phase, self.noise_scale * additive)
