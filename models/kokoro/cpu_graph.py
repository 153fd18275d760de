"""Kokoro's synthesizer rewritten for onnxruntime on CPU: the same function in fewer passes over memory.

    from models.kokoro.cpu_graph import cpu_model
    fast = cpu_model(voice.model)        # a copy; ``voice.model`` is left as it is

Why (onnxruntime 1.32 profile of the exported synthesizer, 2 threads, one warm Japanese sentence,
docs/results/cpu_8_kokoro_cpu.json): convolutions take 43 % of the time and element-wise ops
over (B, C, T) most of the rest (Mul 16 %, Sin 7 %, Cast 6 %, Sub 6 %, Add 5 %, ReduceSum 3 %,
Div 3 %, Pow 3 %). onnxruntime's CPU provider fuses none of them, so each is one pass over a tensor of
128 channels at 4,800 frames per second of audio. Most come from the generator's AdaIN residual
blocks: masked instance-norm statistics in float64 (casts, then a dozen float64 passes), then
Snake ``x + sin(alpha x)^2 / alpha``. Here, per AdaIN + Snake pair:

* float32 statistics from two sums, ``sum(x)`` and ``sum(x^2)`` (variance = E[x^2] - E[x]^2),
  folded with the style's scale and shift and Snake's alpha into one per-channel affine
  ``z = x * a + b`` (z = alpha * AdaIN(x)), then Snake as ``(z + sin(z)^2) / alpha``;

9 element-wise passes and 2 reductions where the exported model has 15 (six of them in float64).
Snake's ``1 / alpha`` is not folded into the next convolution's weights (one pass fewer) because
that leaves the convolution's input scaled by alpha per channel, and trained alphas reach 0.02: an
INT8 graph's per-tensor activation scale then crushes those channels (generator convs2 in INT8:
7.3 dB waveform SNR against float with the fold).
Everything else in the model takes float32 statistics (``set_statistics_dtype``). Parity with the
float32-weights port on real weights is in the results file; the graph keeps the padded-batch
semantics (masks) and the module names, so node names and the int8 stage's blocks are unchanged.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from models.kokoro.layers import INSTANCE_NORM_EPS, AdaINResBlock1, set_statistics_dtype
from models.kokoro.model import KokoroModel


class FusedAdaINSnake(nn.Module):
    """``snake(AdaIN1d(x))`` through one per-channel affine (module docstring), zero past ``mask``."""

    def __init__(self, norm: nn.Module, alpha: torch.Tensor):
        super().__init__()
        self.fc = copy.deepcopy(norm.fc)
        self.register_buffer("alpha", alpha.detach().clone())  # (1, C, 1)

    def forward(self, x: torch.Tensor, style: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # (B, C, 1) each
        if mask is None:
            mean, mean_square = x.mean(dim=-1, keepdim=True), (x * x).mean(dim=-1, keepdim=True)
        else:
            frames = mask.sum(dim=-1, keepdim=True)  # (B, 1, 1)
            masked = x * mask  # (B, C, T)
            mean = masked.sum(dim=-1, keepdim=True) / frames  # (B, C, 1)
            mean_square = (masked * x).sum(dim=-1, keepdim=True) / frames
        variance = (mean_square - mean * mean).clamp_min(0)  # biased, as InstanceNorm's
        scale = self.alpha * (1 + gamma) * torch.rsqrt(variance + INSTANCE_NORM_EPS)  # (B, C, 1)
        z = x * scale + (self.alpha * beta - scale * mean)  # (B, C, T): alpha * AdaIN(x)
        if mask is not None:
            z = z * mask  # snake(0) = 0: zero past the end
        sine = torch.sin(z)
        return (z + sine * sine) * (1 / self.alpha)


class FusedAdaINResBlock1(nn.Module):
    """AdaINResBlock1 with each AdaIN + Snake fused (module docstring); same attribute names."""

    def __init__(self, block: AdaINResBlock1):
        super().__init__()
        self.convs1, self.convs2 = copy.deepcopy(block.convs1), copy.deepcopy(block.convs2)
        self.adain1 = nn.ModuleList(FusedAdaINSnake(n, a) for n, a in zip(block.adain1, block.alpha1))
        self.adain2 = nn.ModuleList(FusedAdaINSnake(n, a) for n, a in zip(block.adain2, block.alpha2))

    def forward(self, x: torch.Tensor, style: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv1, conv2, norm1, norm2 in zip(self.convs1, self.convs2, self.adain1, self.adain2):
            residual = conv1(norm1(x, style, mask))
            x = x + conv2(norm2(residual, style, mask))
            if mask is not None:
                x = x * mask
        return x  # (B, C, T)


def cpu_model(model: KokoroModel) -> KokoroModel:
    """A copy of ``model`` for the CPU graph: float32 statistics everywhere, the generator's
    residual blocks fused (module docstring). Blocks are found wherever they sit, so a decoder a
    stage wrapped (a precision island) is rewritten too."""
    fast = set_statistics_dtype(copy.deepcopy(model), torch.float32)
    for parent in list(fast.modules()):
        for name, child in parent.named_children():
            if isinstance(child, AdaINResBlock1):
                setattr(parent, name, FusedAdaINResBlock1(child))  # ModuleList names are its indices
    return fast.eval()
