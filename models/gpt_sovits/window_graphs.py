"""A streamed sentence's SoVITS windows as CUDA graphs.

At batch 1 a window's SoVITS pass (prior + flow + decoder, ~1 s of audio) is launch-bound: about
25 ms eager in FP16 on an H200, about 5 ms as one graph replay. A graph needs fixed shapes, so the
phones are padded to a multiple of ``PHONE_BUCKET`` (and masked: the prior attends only the
sentence's own phones) and the prior noise is drawn for an upper bound of the window's frames and
cut to the prior's length inside the graph. Graphs are keyed by (tokens in the window, phone
bucket, speed, noise scale) and captured on first use, so sentences of similar length share them.

    windows = WindowGraphs()
    audio = windows.audio(sovits, codes, phoneme_ids, ge, noise, speed, noise_scale)   # (1, 1, samples)
"""
from __future__ import annotations

import math

import torch
from torch import nn

from models.cuda_graphs import GraphCache
from models.gpt_sovits.sovits import SovitsSynthesizer

PHONE_BUCKET = 32  # phones are padded up to a multiple of this: one graph serves a range of sentences


def noise_frames_bound(tokens: int, frames_per_token: int, speed: float) -> int:
    """At least the prior's latent frames for ``tokens`` tokens at ``speed`` (its interpolation
    rounds; two frames of margin)."""
    return math.ceil(tokens * frames_per_token / speed) + 2


class WindowSynthesis(nn.Module):
    """One window's SoVITS pass with padded phones: the stage a graph captures."""

    def __init__(self, sovits: SovitsSynthesizer, speed: float, noise_scale: float):
        super().__init__()
        self.sovits, self.speed, self.noise_scale = sovits, speed, noise_scale

    def forward(self, codes: torch.Tensor, phones: torch.Tensor, phone_lengths: torch.Tensor, ge: torch.Tensor,
                noise: torch.Tensor) -> torch.Tensor:
        """codes (1, 1, n), phones (1, T_pad), phone_lengths (1,), ge (1, 512, 1),
        noise (1, inter, F >= T') -> audio (1, 1, T' * hop)."""
        m_p, logs_p, mask = self.sovits.prior(codes, phones, ge, speed=self.speed, phoneme_lengths=phone_lengths)
        window_noise = noise[..., : m_p.shape[-1]] if self.noise_scale else None
        return self.sovits.synthesize_latent(m_p, logs_p, mask, ge, window_noise, self.noise_scale)[1]


def pad_phones(phoneme_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, T_x) -> ((1, T_pad) zero-padded to a multiple of PHONE_BUCKET, (1,) the real length)."""
    length = phoneme_ids.shape[1]
    padded = phoneme_ids.new_zeros(1, math.ceil(length / PHONE_BUCKET) * PHONE_BUCKET)
    padded[:, :length] = phoneme_ids
    return padded, torch.tensor([length], device=phoneme_ids.device)


class WindowGraphs:
    """The graphs of one voice's windows (CUDA only)."""

    def __init__(self):
        self.cache = GraphCache()

    def audio(self, sovits: SovitsSynthesizer, codes: torch.Tensor, phoneme_ids: torch.Tensor, ge: torch.Tensor,
              noise: torch.Tensor, speed: float, noise_scale: float) -> torch.Tensor:
        """(1, 1, samples), valid until the next call (a graph's output buffer)."""
        phones, lengths = pad_phones(phoneme_ids)
        key = (codes.shape[-1], phones.shape[1], speed, noise_scale)
        stage = WindowSynthesis(sovits, speed, noise_scale)
        return self.cache.run(key, stage, (codes, phones, lengths, ge, noise))[0]
