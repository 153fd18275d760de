"""EmotiVoice's vocoder: a HiFi-GAN V1 generator (ResBlock1) turning mel frames into 16 kHz audio.

Every convolution carries weight norm (``parametrizations.weight.original0/1``, the naming torch
writes today; the loader maps the legacy ``weight_g/weight_v`` onto it). ``remove_weight_norm``
folds it for inference, which changes no output.

Given ``frame_lengths``, padding is zeroed in front of every convolution so a padded batch row
equals its single run (the official code has no such mask; at batch 1 both are identical).

``chunk_rows`` runs the stages from ``chunk_from_stage`` on over a few batch rows at a time. Why: past
the first stage every row's activations are ~16 KiB a frame in FP16 (128 channels at 64x the frame
rate, 64 at 128x, 32 at 256x), so a batch of 32 rows of 200 frames writes ~100 MiB in each of a
stage's 19 convolutions and in the elementwise pass after each; all the 32-channel convolutions and most
of the 64-channel ones do too few sums per byte to be bound by anything but memory
(scripts/emotivoice_vocoder_roofline.py). A chunk of a few rows keeps each tensor a convolution writes
small enough to still be in the GPU's L2 cache (50 MiB on an H100 or H200) when the next kernel reads
it. Same sums, same order within a row: outputs equal the whole batch's up to rounding (a convolution's
kernel may be picked per row count).
"""
from __future__ import annotations

import math

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
        self.row_chunk: int | None = None  # see chunk_rows
        self.chunk_from_stage = 1

    def remove_weight_norm(self) -> None:
        """Fold g * v / |v| into plain weights (same outputs, fewer kernels per call)."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)

    def chunk_rows(self, rows: int | None, from_stage: int = 1) -> "HifiganGenerator":
        """Run stages ``from_stage``.. over ``rows`` batch rows at a time (module docstring); None: whole."""
        if rows is not None and rows < 1:
            raise ValueError(f"chunk_rows={rows}: at least 1, or None for the whole batch")
        if not 0 <= from_stage < len(self.upsample_rates):
            raise ValueError(f"chunk_from_stage={from_stage}: one of the {len(self.upsample_rates)} stages")
        self.row_chunk, self.chunk_from_stage = rows, from_stage
        return self

    def forward(self, mel: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, n_mels, T_feats); ``frame_lengths`` (B,) masks padded frames, None runs unmasked."""
        rows, split = self.row_chunk, self.chunk_from_stage
        if rows is None or mel.size(0) <= rows:
            return self.tail(self.head(mel, frame_lengths, 0), frame_lengths, 0)
        x = self.head(mel, frame_lengths, split)  # (B, C_split, T * factor before split)
        return torch.cat([self.tail(x[start:start + rows],
                                    None if frame_lengths is None else frame_lengths[start:start + rows], split)
                          for start in range(0, x.size(0), rows)])  # (B, 1, T_audio)

    def head(self, mel: torch.Tensor, frame_lengths: torch.Tensor | None, stop: int) -> torch.Tensor:
        """The input convolution and stages 0..``stop - 1``: (B, n_mels, T) -> (B, C, T * their rates)."""
        x = self.conv_pre(_masked(mel, _frame_mask(frame_lengths, 1, mel)))  # (B, C0, T)
        return self._stages(x, frame_lengths, 0, stop)[0] if stop else x

    def tail(self, x: torch.Tensor, frame_lengths: torch.Tensor | None, first: int) -> torch.Tensor:
        """Stages ``first``.. and the output convolution: what ``head(mel, frame_lengths, first)`` gave
        -> audio (B, 1, T_audio) in [-1, 1]."""
        x, mask = self._stages(x, frame_lengths, first, len(self.upsample_rates))  # (B, C_last, T_audio)
        return torch.tanh(self.conv_post(_masked(F.leaky_relu(x, FINAL_LRELU_SLOPE), mask)))

    def _stages(self, x: torch.Tensor, frame_lengths: torch.Tensor | None, first: int,
                stop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Stages ``first``..``stop - 1``: x (B, C, T * the rates before ``first``) -> (B, C', T * those to
        ``stop``) and its padding mask (B, 1, T * those to ``stop``), None unmasked."""
        factor = math.prod(self.upsample_rates[:first])
        mask = _frame_mask(frame_lengths, factor, x)
        for stage in range(first, stop):
            x = self.ups[stage](_masked(F.leaky_relu(x, LRELU_SLOPE), mask))  # (B, C_i, T * factor)
            factor *= self.upsample_rates[stage]
            mask = _frame_mask(frame_lengths, factor, x)
            blocks = self.resblocks[stage * self.num_kernels:(stage + 1) * self.num_kernels]
            total = blocks[0](x, mask)
            for block in blocks[1:]:
                total = total + block(x, mask)
            x = total / self.num_kernels
        return x, mask


def _frame_mask(frame_lengths: torch.Tensor | None, factor: int, x: torch.Tensor) -> torch.Tensor | None:
    """(B, 1, T) in x's dtype: 1 within each row's ``frame_lengths * factor`` steps; None unmasked."""
    if frame_lengths is None:
        return None
    valid = torch.arange(x.size(-1), device=x.device)[None, :] < (frame_lengths * factor)[:, None]
    return valid.unsqueeze(1).to(x.dtype)
