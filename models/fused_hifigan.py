"""A HiFi-GAN V1 generator (ResBlock1) run as fused Triton convolutions (models/triton_conv1d.py).

    vocoder = FusedHifigan(generator, slope=0.1, final_slope=0.01, dtype=torch.float16)
    audio = vocoder(mel, frame_lengths)  # (B, n_mels, T) -> (B, 1, T * hop), as generator(mel, frame_lengths)

The generator is any module with HiFi-GAN V1's parts: ``conv_pre``, ``ups`` (transposed
convolutions with kernel 2 x stride), ``resblocks`` (``num_kernels`` per upsampling stage, each with
``convs1`` (dilated) and ``convs2``), ``conv_post`` and ``upsample_rates``; weight norm may still be on
(it is folded here). Its forward is reproduced with a padding mask: given ``frame_lengths``, every
convolution reads zeros past a row's valid samples, so a padded batch row computes what its single
run computes. Without ``frame_lengths`` every sample is valid (the unmasked official forward).

Activations stay channels-last (B, T, C) from the first convolution to the last, one kernel per
convolution: LeakyReLU, mask, residual sums and the mean over a stage's blocks happen inside the
convolutions, so a stage of 18 convolutions makes 18 passes over its activations instead of about 70
(the elementwise kernels between them). Each block's last convolution adds its share of the stage's
mean into the running sum, which rounds once per block where the module rounds the sum and the
division apart (FP32 accumulation either way; the tests bound the difference).
"""
from __future__ import annotations

import torch
from torch import nn

from models.conv_layout import folded_weight
from models.triton_conv1d import (
    BLOCK_T,
    NUM_WARPS,
    PackedConv,
    conv1d,
    conv_transpose1d,
    pack_conv1d,
    pack_conv_transpose1d,
)


def _packed(conv: nn.Module, dtype: torch.dtype, transposed: bool = False) -> PackedConv:
    expected = nn.ConvTranspose1d if transposed else nn.Conv1d
    if not isinstance(conv, expected):
        raise TypeError(f"expected a {expected.__name__}, got {type(conv).__name__} (convert layouts after, not before)")
    if conv.groups != 1:
        raise ValueError("grouped convolutions are not fused")
    bias = None if conv.bias is None else folded_weight(conv, "bias")
    pack = pack_conv_transpose1d if transposed else pack_conv1d
    return pack(folded_weight(conv, "weight"), bias, dtype)


def _packed_same(conv: nn.Module, dtype: torch.dtype) -> PackedConv:
    packed = _packed(conv, dtype)
    kernel, dilation = conv.kernel_size[0], conv.dilation[0]
    if conv.stride[0] != 1 or conv.padding_mode != "zeros" or conv.padding[0] != (kernel - 1) * dilation // 2:
        raise ValueError(f"{conv}: only stride-1, zero, same-padded convolutions are fused")
    return packed


class FusedHifigan(nn.Module):
    """HiFi-GAN V1's forward over packed weights; the generator itself is not kept or changed."""

    def __init__(self, generator: nn.Module, slope: float, final_slope: float, dtype: torch.dtype,
                 block_t: int = BLOCK_T, num_warps: int = NUM_WARPS):
        """``block_t``, ``num_warps``: every kernel's launch shape (tuning only: same results)."""
        super().__init__()
        self.slope, self.final_slope, self.dtype = slope, final_slope, dtype
        self.launch = dict(block_t=block_t, num_warps=num_warps)
        self.upsample_rates = tuple(generator.upsample_rates)
        self.num_kernels = len(generator.resblocks) // len(self.upsample_rates)
        self.pre = _packed_same(generator.conv_pre, dtype)
        self.post = _packed_same(generator.conv_post, dtype)
        self.ups = []
        for up, rate in zip(generator.ups, self.upsample_rates):
            packed = _packed(up, dtype, transposed=True)
            if ((up.kernel_size[0], up.stride[0], up.padding[0], up.dilation[0]) != (2 * rate, rate, rate // 2, 1)
                    or up.output_padding[0] or rate % 2):
                raise ValueError(f"{up}: only kernel 2 x stride, padding stride / 2, even-stride upsampling is fused")
            self.ups.append(packed)
        self.blocks = []  # per stage: per block: [(conv1, its dilation, conv2, its dilation)]
        for stage in range(len(self.upsample_rates)):
            stage_blocks = []
            for block in generator.resblocks[stage * self.num_kernels:(stage + 1) * self.num_kernels]:
                pairs = []
                for conv1, conv2 in zip(block.convs1, block.convs2):
                    pairs.append((_packed_same(conv1, dtype), conv1.dilation[0],
                                  _packed_same(conv2, dtype), conv2.dilation[0]))
                stage_blocks.append(pairs)
            self.blocks.append(stage_blocks)

    def forward(self, mel: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, n_mels, T_feats), ``frame_lengths`` (B,) or None -> audio (B, 1, T_feats * hop)."""
        x = mel.to(self.dtype).transpose(1, 2).contiguous()  # (B, T, n_mels)
        x = conv1d(x, self.pre, lengths=frame_lengths, **self.launch)  # (B, T, C0)
        factor = 1
        for up, rate, stage_blocks in zip(self.ups, self.upsample_rates, self.blocks):
            x = conv_transpose1d(x, up, rate, self.slope, frame_lengths, factor, **self.launch)  # (B, T * factor * rate, C_i)
            factor *= rate
            total = None  # the running mean of the stage's blocks
            for pairs in stage_blocks:
                y = x
                for index, (conv1, dilation1, conv2, dilation2) in enumerate(pairs):
                    inner = conv1d(y, conv1, dilation1, self.slope, frame_lengths, factor, **self.launch)
                    last = index == len(pairs) - 1
                    y = conv1d(inner, conv2, dilation2, self.slope, frame_lengths, factor, residual=y,
                               scale=1.0 / self.num_kernels if last else 1.0, accumulate=total if last else None,
                               **self.launch)
                total = y
            x = total
        audio = conv1d(x, self.post, slope=self.final_slope, lengths=frame_lengths, length_factor=factor, tanh=True,
                       **self.launch)
        return audio.transpose(1, 2)  # (B, 1, T_audio)
