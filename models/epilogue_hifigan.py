"""A HiFi-GAN V1 generator (ResBlock1) whose block convolutions carry their elementwise tail in
cuDNN's epilogue (models/cudnn_epilogue.py).

    vocoder = EpilogueHifigan(generator, slope=0.1, final_slope=0.01)
    audio = vocoder(mel, frame_lengths)  # (B, n_mels, T) -> (B, 1, T * hop), as generator(mel, frame_lengths)

The generator is any module with HiFi-GAN V1's parts (``conv_pre``, ``ups``, ``resblocks`` with
``convs1``/``convs2``, ``conv_post``, ``upsample_rates``); its ``conv_pre``, ``ups`` and
``conv_post`` are kept as modules (so models/conv_layout.py can convert them), the block
convolutions' weights are folded (weight norm evaluated) and kept channels-fastest. Given
``frame_lengths`` every convolution reads zeros past a row's valid samples, as the generator's own
masked forward does.

A block's residual stream x never goes to memory: only its activation a = mask * lrelu(x) does.
LeakyReLU of slope s is invertible, x = lrelu(a, 1 / s) wherever the mask is 1, so each block
step is two operator calls:
``t = mask * lrelu(conv1(a) + b1)`` and ``a' = mask * lrelu(conv2(t) + b2 + lrelu(a, 1 / s))``.
Past a row's end x reads as 0 instead of what the unmasked stream held there; nothing valid reads
it, since every convolution's input is masked. The stage's mean over its blocks and the next
activation are plain PyTorch, which torch.compile fuses into one kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.conv_layout import folded_weight
from models.cudnn_epilogue import channels_fastest, conv_lrelu


def _same_padded(conv: nn.Module) -> tuple[int, int]:
    """(padding, dilation) of a stride-1, zero-padded convolution that keeps the length."""
    if not isinstance(conv, nn.Conv1d):
        raise TypeError(f"expected an nn.Conv1d, got {type(conv).__name__} (convert layouts after, not before)")
    kernel, dilation, padding = conv.kernel_size[0], conv.dilation[0], conv.padding[0]
    same_length = 2 * padding == dilation * (kernel - 1)
    if conv.groups != 1 or conv.stride[0] != 1 or conv.padding_mode != "zeros" or not same_length:
        raise ValueError(f"{conv}: only ungrouped, stride-1, zero, same-padded block convolutions are supported")
    if conv.bias is None:
        raise ValueError(f"{conv}: the epilogue adds a bias; this convolution has none")
    return padding, dilation


class EpilogueHifigan(nn.Module):
    """HiFi-GAN V1's masked forward with its block convolutions as ``conv_lrelu`` calls."""

    def __init__(self, generator: nn.Module, slope: float, final_slope: float):
        super().__init__()
        if not 0 < slope < 1:
            raise ValueError(f"slope {slope}: the residual is read back through lrelu(a, 1 / slope), so 0 < slope < 1")
        self.slope, self.final_slope = slope, final_slope
        self.upsample_rates = tuple(generator.upsample_rates)
        self.num_kernels = len(generator.resblocks) // len(self.upsample_rates)
        self.conv_pre, self.ups, self.conv_post = generator.conv_pre, generator.ups, generator.conv_post
        self.steps: list[list[list[tuple[str, int, int, str, int, int]]]] = []  # stage -> block -> step
        for stage in range(len(self.upsample_rates)):
            stage_blocks = []
            for index in range(stage * self.num_kernels, (stage + 1) * self.num_kernels):
                block, steps = generator.resblocks[index], []
                if not (hasattr(block, "convs1") and hasattr(block, "convs2")):
                    raise TypeError(f"resblocks.{index} is a {type(block).__name__}: only ResBlock1 blocks "
                                    "(convs1 and convs2) are supported")
                for step, (conv1, conv2) in enumerate(zip(block.convs1, block.convs2)):
                    names = []
                    for which, conv in (("1", conv1), ("2", conv2)):
                        name = f"block{index}_step{step}_conv{which}"
                        self.register_buffer(f"{name}_weight", channels_fastest(folded_weight(conv, "weight")))
                        self.register_buffer(f"{name}_bias", folded_weight(conv, "bias"))
                        names.append((name, *_same_padded(conv)))
                    steps.append((*names[0], *names[1]))
                stage_blocks.append(steps)
            self.steps.append(stage_blocks)

    def _conv(self, name: str, x, mask, padding: int, dilation: int, residual=None):
        return conv_lrelu(x, getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias"), mask, padding, dilation,
                          self.slope, residual=residual, residual_slope=1.0 / self.slope)

    def forward(self, mel: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, n_mels, T_feats); ``frame_lengths`` (B,) masks padded frames, None: every frame valid."""
        def mask_at(factor: int, steps: int) -> torch.Tensor:  # (B, 1, steps) in mel's dtype
            if frame_lengths is None:
                return torch.ones(mel.size(0), 1, steps, dtype=mel.dtype, device=mel.device)
            valid = torch.arange(steps, device=mel.device)[None, :] < (frame_lengths * factor)[:, None]
            return valid.unsqueeze(1).to(mel.dtype)

        mask = mask_at(1, mel.size(-1))
        x = self.conv_pre(mel * mask)  # (B, C0, T)
        factor = 1
        for stage, rate in enumerate(self.upsample_rates):
            x = self.ups[stage](F.leaky_relu(x, self.slope) * mask)  # (B, C_i, T * factor)
            factor *= rate
            mask = mask_at(factor, x.size(-1))
            first = F.leaky_relu(x, self.slope) * mask
            total = None
            for steps in self.steps[stage]:
                a = first
                for name1, padding1, dilation1, name2, padding2, dilation2 in steps:
                    inner = self._conv(name1, a, mask, padding1, dilation1)
                    a = self._conv(name2, inner, mask, padding2, dilation2, residual=a)
                stream = F.leaky_relu(a, 1.0 / self.slope)  # the block's x (masked)
                total = stream if total is None else total + stream
            x = total / self.num_kernels
        x = self.conv_post(F.leaky_relu(x, self.final_slope) * mask)
        return torch.tanh(x)  # (B, 1, T_audio)
