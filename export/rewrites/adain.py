"""AdaIN (instance norm, then per-sample scale and shift from a style vector) in a form TensorRT runs at batch > 1.

StyleTTS2 / Kokoro decoders use ``AdaIN1d``: InstanceNorm1d without affine, then
``(1 + gamma(style)) * x_norm + beta(style)``. Exported, the norm becomes InstanceNormalization,
whose scale and bias TensorRT wants as initializers, and a per-sample affine cannot be one.
``DecomposedAdaIN1d`` computes the same function with ReduceMean / Sub / Mul / Sqrt / Div over
time and a per-sample affine from the same Linear: every op is native in TensorRT, any batch.

    model = swap_adain(model)   # every AdaIN1d replaced in place by a DecomposedAdaIN1d sharing its weights
"""
from __future__ import annotations

import torch
from torch import nn


class AdaIN1d(nn.Module):
    """Reference: InstanceNorm1d + style-conditioned scale and shift. x: (B, C, T), style: (B, D_style)."""

    def __init__(self, style_dim: int, channels: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.InstanceNorm1d(channels, affine=False, eps=eps)
        self.fc = nn.Linear(style_dim, 2 * channels)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # 2 x (B, C, 1)
        return (1 + gamma) * self.norm(x) + beta


class DecomposedAdaIN1d(nn.Module):
    """Same function as AdaIN1d: mean and (biased) variance over time, then the per-sample affine."""

    def __init__(self, fc: nn.Linear, eps: float):
        super().__init__()
        self.fc = fc
        self.eps = eps

    @classmethod
    def from_reference(cls, module: AdaIN1d) -> "DecomposedAdaIN1d":
        return cls(module.fc, module.norm.eps)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, C, 1)
        centered = x - mean
        variance = (centered * centered).mean(dim=-1, keepdim=True)  # (B, C, 1), biased as InstanceNorm's
        normalized = centered / torch.sqrt(variance + self.eps)
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # 2 x (B, C, 1)
        return (1 + gamma) * normalized + beta


def swap_adain(model: nn.Module) -> nn.Module:
    """Replace every AdaIN1d inside ``model`` (or ``model`` itself) by a DecomposedAdaIN1d; returns the model."""
    if isinstance(model, AdaIN1d):
        return DecomposedAdaIN1d.from_reference(model)
    for name, child in model.named_children():
        setattr(model, name, swap_adain(child))
    return model
