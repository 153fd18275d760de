"""Building blocks several families' networks share, with the parameter names their official
checkpoints use (VITS, SoVITS and StyleTTS2 all name a channel LayerNorm's affine gamma/beta)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of a (B, C, T) tensor; parameters named gamma/beta."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x.transpose(1, -1), (x.shape[1],), self.gamma, self.beta, self.eps)  # (B, T, C)
        return normed.transpose(1, -1)  # (B, C, T)
