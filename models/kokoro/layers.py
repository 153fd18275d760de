"""Style-conditioned building blocks shared by Kokoro's prosody predictor and decoder.

Weight-normalised convolutions of the official checkpoint are held here as plain convolutions
with the folded weight g*v/||v|| (the loaders fold them): inference and export never see the
parametrization. The InstanceNorm inside AdaIN has no affine parameters because the official
ones are never trained (absent from the file, left at 1 and 0).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INSTANCE_NORM_EPS = 1e-5  # torch.nn.InstanceNorm1d's default, which the official AdaIN1d uses
RESIDUAL_SCALE = 2 ** -0.5  # (residual + shortcut) / sqrt(2) keeps the variance of the sum


class AdaIN1d(nn.Module):
    """(1 + gamma(s)) * InstanceNorm(x) + beta(s): normalisation over time, then a per-sample,
    per-channel scale and shift from the style vector.

    The norm is written out (mean and biased variance over time) rather than as instance_norm, the
    form of export/rewrites/adain.py's DecomposedAdaIN1d: exported, it is ReduceMean/Sub/Mul/Sqrt,
    which TensorRT runs at any batch, where InstanceNormalization wants its affine as initializers.

    ``mask`` (B, 1, T), 1 on an item's valid frames: the statistics are taken over those frames only
    and the output is zero past them, so a padded item normalises as it would alone.

    ``statistics_dtype`` (float64 unless ``set_statistics_dtype`` says otherwise) is the precision of
    the masked statistics: float32 for a graph TensorRT builds (it has no float64)."""

    def __init__(self, style_dim: int, channels: int):
        super().__init__()
        self.fc = nn.Linear(style_dim, 2 * channels)
        self.statistics_dtype = torch.float64

    def forward(self, x: torch.Tensor, style: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # (B, C, 1) each
        if mask is None:
            centered = x - x.mean(dim=-1, keepdim=True)  # (B, C, T)
            variance = (centered * centered).mean(dim=-1, keepdim=True)  # (B, C, 1), biased as InstanceNorm's
            return (1 + gamma) * (centered / torch.sqrt(variance + INSTANCE_NORM_EPS)) + beta  # (B, C, T)
        # Statistics in float64 by default, exported too: a sum's float32 rounding depends on how far
        # the padding reaches and on the kernel, and a channel nearly constant over time (a steady
        # source, as with the noise off) turns that rounding into its output; float64 sums agree to
        # the bit. In float32 the casts vanish; real weights: 113 dB decoder SNR against float64.
        wide, wide_mask = x.to(self.statistics_dtype), mask.to(self.statistics_dtype)
        frames = wide_mask.sum(dim=-1, keepdim=True)  # (B, 1, 1)
        centered = (wide - (wide * wide_mask).sum(dim=-1, keepdim=True) / frames) * wide_mask  # (B, C, T), 0 past the end
        variance = (centered * centered).sum(dim=-1, keepdim=True) / frames  # (B, C, 1)
        normalised = (centered / torch.sqrt(variance + INSTANCE_NORM_EPS)).to(x.dtype)
        return ((1 + gamma) * normalised + beta) * mask


STATISTICS_DTYPES = (torch.float64, torch.float32)


def set_statistics_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Every AdaIN1d in ``model`` takes its masked statistics in ``dtype``; returns ``model``."""
    if dtype not in STATISTICS_DTYPES:
        raise ValueError(f"AdaIN statistics dtype {dtype}: use one of {list(STATISTICS_DTYPES)}")
    for module in model.modules():
        if isinstance(module, AdaIN1d):
            module.statistics_dtype = dtype
    return model


class AdaLayerNorm(nn.Module):
    """LayerNorm over channels without affine parameters, then the style's scale and shift."""

    def __init__(self, style_dim: int, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels = channels
        self.eps = eps
        self.fc = nn.Linear(style_dim, 2 * channels)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        # x: (B, T, C)
        gamma, beta = self.fc(style).unsqueeze(1).chunk(2, dim=-1)  # (B, 1, C) each
        return (1 + gamma) * F.layer_norm(x, (self.channels,), eps=self.eps) + beta


class AdainResBlk1d(nn.Module):
    """StyleTTS2's residual block: AdaIN -> LeakyReLU(0.2) -> [x2 upsample] -> conv, twice, added
    to a (1x1-projected, upsampled) shortcut and scaled by 1/sqrt(2). ``mask`` (B, 1, T) marks the
    input's valid frames (AdaIN1d); the output is zero past them (past twice as many when upsampling),
    which is the zero padding the convolutions of an item alone see."""

    def __init__(self, dim_in: int, dim_out: int, style_dim: int, upsample: bool = False):
        super().__init__()
        self.upsample = upsample
        self.conv1 = nn.Conv1d(dim_in, dim_out, 3, 1, 1)
        self.conv2 = nn.Conv1d(dim_out, dim_out, 3, 1, 1)
        self.norm1 = AdaIN1d(style_dim, dim_in)
        self.norm2 = AdaIN1d(style_dim, dim_out)
        self.conv1x1 = nn.Conv1d(dim_in, dim_out, 1, 1, 0, bias=False) if dim_in != dim_out else None
        # Depthwise transposed conv doubles the residual's frame rate (k3, s2, p1, output_padding 1).
        self.pool = (nn.ConvTranspose1d(dim_in, dim_in, 3, stride=2, padding=1, output_padding=1, groups=dim_in)
                     if upsample else None)

    def forward(self, x: torch.Tensor, style: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out_mask = mask
        if self.upsample:
            shortcut = x.repeat_interleave(2, dim=-1)  # nearest x2
            out_mask = None if mask is None else mask.repeat_interleave(2, dim=-1)  # (B, 1, 2T)
        else:
            shortcut = x
        if self.conv1x1 is not None:
            shortcut = self.conv1x1(shortcut)
        residual = F.leaky_relu(self.norm1(x, style, mask), 0.2)
        if self.pool is not None:
            residual = self.pool(residual)
            if out_mask is not None:
                residual = residual * out_mask  # the depthwise conv's bias past the end
        residual = self.conv1(residual)
        residual = self.conv2(F.leaky_relu(self.norm2(residual, style, out_mask), 0.2))
        out = (residual + shortcut) * RESIDUAL_SCALE  # (B, C_out, T or 2T)
        return out if out_mask is None else out * out_mask


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """x + sin^2(alpha x) / alpha: a periodic activation for waveform generators."""
    return x + (1 / alpha) * torch.sin(alpha * x) ** 2


class AdaINResBlock1(nn.Module):
    """HiFi-GAN resblock type 1 with AdaIN before each conv and Snake activations; ``mask`` as
    AdainResBlk1d's (the output is zero past an item's frames)."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...], style_dim: int):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, 1, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations)
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, 1, padding=(kernel_size - 1) // 2) for _ in dilations)
        self.adain1 = nn.ModuleList(AdaIN1d(style_dim, channels) for _ in dilations)
        self.adain2 = nn.ModuleList(AdaIN1d(style_dim, channels) for _ in dilations)
        self.alpha1 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)
        self.alpha2 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)

    def forward(self, x: torch.Tensor, style: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv1, conv2, norm1, norm2, alpha1, alpha2 in zip(
                self.convs1, self.convs2, self.adain1, self.adain2, self.alpha1, self.alpha2):
            residual = conv1(snake(norm1(x, style, mask), alpha1))  # snake(0) = 0: zeros stay zeros
            x = x + conv2(snake(norm2(residual, style, mask), alpha2))
            if mask is not None:
                x = x * mask
        return x  # (B, C, T)
