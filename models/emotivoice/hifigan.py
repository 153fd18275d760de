"""EmotiVoice's vocoder: a HiFi-GAN V1 generator (ResBlock1) turning mel frames into 16 kHz audio.

Every convolution carries weight norm (``parametrizations.weight.original0/1``, the naming torch
writes today; the loader maps the legacy ``weight_g/weight_v`` onto it). ``remove_weight_norm``
folds it for inference, which changes no output.

Given ``frame_lengths``, padding is zeroed in front of every convolution so a padded batch row
equals its single run (the official code has no such mask; at batch 1 both are identical).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from models.emotivoice.config import GeneratorConfig

LRELU_SLOPE = 0.1  # inside the stages; the last activation uses torch's default 0.01 as upstream
FINAL_LRELU_SLOPE = 0.01


def _same_padding(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


class ResBlock1(nn.Module):
    """Three times: x += conv2(lrelu(conv1_dilated(lrelu(x))))."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_same_padding(kernel_size, d)))
            for d in dilations)
        self.convs2 = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, padding=_same_padding(kernel_size, 1)))
            for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # (B, C, T)
        for conv1, conv2 in zip(self.convs1, self.convs2):
            residual = conv1(_masked(F.leaky_relu(x, LRELU_SLOPE), mask))
            x = x + conv2(_masked(F.leaky_relu(residual, LRELU_SLOPE), mask))
        return x


class HifiganGenerator(nn.Module):
    """``generator`` of the released checkpoint: (B, n_mels, T_feats) -> (B, 1, T_feats * hop)."""

    def __init__(self, config: GeneratorConfig):
        super().__init__()
        self.upsample_rates = config.upsample_rates
        self.num_kernels = len(config.resblock_kernel_sizes)
        channels = config.upsample_initial_channel
        self.conv_pre = weight_norm(nn.Conv1d(config.initial_channel, channels, 7, padding=3))
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for stage, (rate, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes)):
            in_channels, out_channels = channels // 2 ** stage, channels // 2 ** (stage + 1)
            self.ups.append(weight_norm(nn.ConvTranspose1d(in_channels, out_channels, kernel, rate,
                                                           padding=(kernel - rate) // 2)))
            for kernel_size, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes):
                self.resblocks.append(ResBlock1(out_channels, kernel_size, dilations))
        self.conv_post = weight_norm(nn.Conv1d(out_channels, 1, 7, padding=3))

    def remove_weight_norm(self) -> None:
        """Fold g * v / |v| into plain weights (same outputs, fewer kernels per call)."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)

    def forward(self, mel: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, n_mels, T_feats); ``frame_lengths`` (B,) masks padded frames, None runs unmasked."""
        def mask_at(factor: int, steps: int):  # (B, 1, steps) in x's dtype, or None
            if frame_lengths is None:
                return None
            valid = torch.arange(steps, device=mel.device)[None, :] < (frame_lengths * factor)[:, None]
            return valid.unsqueeze(1).to(mel.dtype)

        mask = mask_at(1, mel.size(-1))
        x = self.conv_pre(_masked(mel, mask))  # (B, C0, T)
        factor = 1
        for stage, rate in enumerate(self.upsample_rates):
            x = self.ups[stage](_masked(F.leaky_relu(x, LRELU_SLOPE), mask))  # (B, C_i, T * factor)
            factor *= rate
            mask = mask_at(factor, x.size(-1))
            blocks = self.resblocks[stage * self.num_kernels:(stage + 1) * self.num_kernels]
            total = blocks[0](x, mask)
            for block in blocks[1:]:
                total = total + block(x, mask)
            x = total / self.num_kernels
        x = self.conv_post(_masked(F.leaky_relu(x, FINAL_LRELU_SLOPE), mask))
        return torch.tanh(x)  # (B, 1, T_audio)
