"""Piper's VITS inference model in PyTorch: text encoder -> duration predictor -> flow -> HiFi-GAN.

Only the inference path exists here (no posterior encoder, no discriminators). Shapes follow
the voice: ``VitsHyperParams.from_state_dict`` reads them off an imported state dict, so x-low,
low, medium and high voices all load into the same classes.

Two deliberate departures from the training code, both exact at inference:
* noise is an input (``VitsSampling``), never an internal ``randn``;
* alignment is built from cumulative sums of the durations (no data-dependent scatter).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from models.layers import ChannelLayerNorm
from models.piper.spline import inverse_rational_quadratic_spline

LRELU_SLOPE = 0.1  # HiFi-GAN's slope between layers; the final activation uses torch's 0.01


@dataclass(frozen=True)
class VitsHyperParams:
    num_symbols: int
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    encoder_kernel_size: int = 3
    window_size: int = 4
    latent_channels: int = 192  # "inter_channels": the flow's latent width
    flow_layers: int = 4  # coupling layers in the residual flow
    flow_wn_layers: int = 4
    flow_kernel_size: int = 5
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_flows: int = 4
    spline_bins: int = 10
    spline_tail_bound: float = 5.0
    upsample_initial_channel: int = 256
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    resblock_type: str = "2"  # "1": two convs per dilation (high voices); "2": one (medium and below)
    num_speakers: int = 1
    speaker_channels: int = 0

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)


def sequence_mask(lengths: torch.Tensor, max_length: int | torch.Tensor) -> torch.Tensor:
    positions = torch.arange(max_length, device=lengths.device)  # (T,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)


# ---------------------------------------------------------------- text encoder


class RelativeMultiHeadAttention(nn.Module):
    """Self-attention with learned relative-position embeddings for offsets in [-window, window].

    A banded formulation: logits against the 2w+1 relative keys are computed densely, then
    placed on the (T, T) grid with a gather; offsets beyond the window contribute nothing. The
    way back, attention weights per relative offset, is a gather too: offset r of query q is key
    q + r - w, one key at most, so the gather equals a scatter-add over keys bit for bit,
    and exports without ScatterElements(reduction=add), which TensorRT does not import.
    """

    def __init__(self, channels: int, n_heads: int, window_size: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        rel_shape = (1, 2 * window_size + 1, self.head_channels)  # shared across heads
        self.emb_rel_k = nn.Parameter(torch.zeros(rel_shape))
        self.emb_rel_v = nn.Parameter(torch.zeros(rel_shape))

    def _relative_index(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=device)
        offset = positions.unsqueeze(0) - positions.unsqueeze(1)  # (T_q, T_k): key - query
        in_window = offset.abs() <= self.window_size
        index = (offset + self.window_size).clamp(0, 2 * self.window_size)
        return index, in_window

    def _key_index(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """For each query and relative offset, the key it lands on and whether that key exists."""
        queries = torch.arange(length, device=device).unsqueeze(1)  # (T_q, 1)
        offsets = torch.arange(2 * self.window_size + 1, device=device).unsqueeze(0)  # (1, 2w+1)
        key = queries + offsets - self.window_size  # (T_q, 2w+1)
        in_sequence = (key >= 0) & (key < length)
        return key.clamp(0, length - 1), in_sequence

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        batch, channels, length = x.shape
        heads, head_ch = self.n_heads, self.head_channels

        def split_heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, heads, head_ch, length).transpose(2, 3)  # (B, H, T, Ch)

        query = split_heads(self.conv_q(x)) / math.sqrt(head_ch)
        key, value = split_heads(self.conv_k(x)), split_heads(self.conv_v(x))
        index, in_window = self._relative_index(length, x.device)  # (T, T)

        scores = query @ key.transpose(-2, -1)  # (B, H, T, T)
        rel_logits = query @ self.emb_rel_k[0].transpose(0, 1)  # (B, H, T, 2w+1)
        local = torch.gather(rel_logits, 3, index.expand(batch, heads, length, length))
        scores = scores + local * in_window
        scores = scores.masked_fill(attn_mask == 0, -1e4)
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, T)

        output = weights @ value  # (B, H, T, Ch)
        # The attention weight on each relative offset: (B, H, T, 2w+1), zero where no key is there.
        key_index, in_sequence = self._key_index(length, x.device)  # (T, 2w+1)
        window = 2 * self.window_size + 1
        rel_weights = torch.gather(weights, 3, key_index.expand(batch, heads, length, window)) * in_sequence
        output = output + rel_weights @ self.emb_rel_v[0]
        output = output.transpose(2, 3).reshape(batch, channels, length)
        return self.conv_o(output)


class FeedForward(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.pad = (kernel_size - 1) // 2, kernel_size // 2
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.conv_1(F.pad(x * mask, self.pad))
        x = self.conv_2(F.pad(torch.relu(x) * mask, self.pad))
        return x * mask


class TransformerEncoder(nn.Module):
    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        c = hp.hidden_channels
        self.attn_layers = nn.ModuleList(
            RelativeMultiHeadAttention(c, hp.n_heads, hp.window_size) for _ in range(hp.n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(c) for _ in range(hp.n_layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(c, hp.filter_channels, hp.encoder_kernel_size) for _ in range(hp.n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(c) for _ in range(hp.n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)  # (B, 1, T, T)
        x = x * mask
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm_1(x + attn(x, attn_mask))
            x = norm_2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's mean / log-std per phoneme."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        self.hidden_channels = hp.hidden_channels
        self.emb = nn.Embedding(hp.num_symbols, hp.hidden_channels)
        self.encoder = TransformerEncoder(hp)
        self.proj = nn.Conv1d(hp.hidden_channels, 2 * hp.latent_channels, 1)

    def forward(self, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor):
        x = self.emb(phoneme_ids) * math.sqrt(self.hidden_channels)  # (B, T, C)
        x = x.transpose(1, 2)  # (B, C, T)
        mask = sequence_mask(phoneme_lengths, phoneme_ids.shape[1]).unsqueeze(1).to(x.dtype)  # (B, 1, T)
        x = self.encoder(x, mask)
        prior_mean, prior_log_std = torch.chunk(self.proj(x) * mask, 2, dim=1)  # 2 x (B, C_lat, T)
        return x, prior_mean, prior_log_std, mask


# ---------------------------------------------------------------- stochastic duration predictor


class DilatedDepthSeparableConv(nn.Module):
    def __init__(self, channels: int, kernel_size: int, n_layers: int):
        super().__init__()
        self.convs_sep = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            padding = (kernel_size * dilation - dilation) // 2
            self.convs_sep.append(
                nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=dilation, padding=padding)
            )
        self.convs_1x1 = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in range(n_layers))
        self.norms_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))
        self.norms_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        if cond is not None:
            x = x + cond
        for sep, pointwise, norm_1, norm_2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(norm_1(sep(x * mask)))
            y = F.gelu(norm_2(pointwise(y)))
            x = x + y
        return x * mask


class ConvFlow(nn.Module):
    """Coupling layer whose transform is a monotonic rational-quadratic spline."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        self.num_bins = hp.spline_bins
        self.tail_bound = hp.spline_tail_bound
        self.filter_channels = hp.dp_filter_channels
        self.pre = nn.Conv1d(1, hp.dp_filter_channels, 1)
        self.convs = DilatedDepthSeparableConv(hp.dp_filter_channels, hp.dp_kernel_size, n_layers=3)
        self.proj = nn.Conv1d(hp.dp_filter_channels, 3 * hp.spline_bins - 1, 1)

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        z0, z1 = z[:, :1], z[:, 1:]  # (B, 1, T) each
        h = self.proj(self.convs(self.pre(z0), mask, cond)) * mask  # (B, 3K-1, T)
        h = h.transpose(1, 2)  # (B, T, 3K-1)
        scale = math.sqrt(self.filter_channels)
        widths = h[..., : self.num_bins] / scale
        heights = h[..., self.num_bins : 2 * self.num_bins] / scale
        derivatives = h[..., 2 * self.num_bins :]
        z1 = inverse_rational_quadratic_spline(z1[:, 0], widths, heights, derivatives, self.tail_bound)
        return torch.cat([z0, z1.unsqueeze(1)], dim=1) * mask


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (z - self.m) * torch.exp(-self.logs) * mask


class DurationConditioning(nn.Module):
    """The text (and speaker) conditioning trunk of a duration predictor: ``pre``, ``convs``, ``proj``
    and ``cond``, named as in Piper checkpoints so that predictors built on it load their weights."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        c = hp.dp_filter_channels
        self.pre = nn.Conv1d(hp.hidden_channels, c, 1)
        self.convs = DilatedDepthSeparableConv(c, hp.dp_kernel_size, n_layers=3)
        self.proj = nn.Conv1d(c, c, 1)
        self.cond = nn.Conv1d(hp.speaker_channels, c, 1) if hp.num_speakers > 1 else None

    def conditioning(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        """x: (B, C, T) text encoding -> (B, c, T) features, zero where ``mask`` (B, 1, T) is."""
        x = self.pre(x)
        if g is not None and self.cond is not None:
            x = x + self.cond(g)
        return self.proj(self.convs(x, mask)) * mask


class StochasticDurationPredictor(DurationConditioning):
    """Reverse flow from (scaled) noise to log-durations, conditioned on the text encoding.

    ``flows`` lists only the layers inference runs, in the order they run: the affine layer's
    inverse comes last; a channel flip precedes every spline layer.
    """

    def __init__(self, hp: VitsHyperParams):
        super().__init__(hp)
        self.spline_flows = nn.ModuleList(ConvFlow(hp) for _ in range(hp.dp_flows - 1))
        self.affine = ElementwiseAffine(2)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (B, C, T); noise: (B, 2, T) already scaled. Returns log-durations (B, 1, T)."""
        x = self.conditioning(x, mask, g)
        z = noise
        for spline in self.spline_flows:
            z = spline.reverse(torch.flip(z, [1]), mask, x)
        z = self.affine.reverse(torch.flip(z, [1]), mask)
        return z[:, :1]


# ---------------------------------------------------------------- residual coupling flow


class WaveNet(nn.Module):
    """Non-causal WaveNet stack with gated tanh/sigmoid units (weight norm already folded)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int, speaker_channels: int = 0):
        super().__init__()
        self.channels = channels
        padding = (kernel_size - 1) // 2
        self.in_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels, kernel_size, padding=padding) for _ in range(n_layers)
        )
        # The last layer only feeds the skip path, so it outputs half the channels.
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels if i < n_layers - 1 else channels, 1) for i in range(n_layers)
        )
        self.cond_layer = nn.Conv1d(speaker_channels, 2 * channels * n_layers, 1) if speaker_channels else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        skip = torch.zeros_like(x)
        cond = self.cond_layer(g) if (g is not None and self.cond_layer is not None) else None
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            h = in_layer(x)  # (B, 2C, T)
            if cond is not None:
                h = h + cond[:, i * 2 * self.channels : (i + 1) * 2 * self.channels]
            acts = torch.tanh(h[:, : self.channels]) * torch.sigmoid(h[:, self.channels :])
            out = res_skip(acts)
            if i < len(self.in_layers) - 1:
                x = (x + out[:, : self.channels]) * mask
                skip = skip + out[:, self.channels :]
            else:
                skip = skip + out
        return skip * mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half is shifted by a function of the first."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        half = hp.latent_channels // 2
        self.pre = nn.Conv1d(half, hp.hidden_channels, 1)
        self.enc = WaveNet(hp.hidden_channels, hp.flow_kernel_size, hp.flow_wn_layers, hp.speaker_channels)
        self.post = nn.Conv1d(hp.hidden_channels, half, 1)

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        half = z.shape[1] // 2
        z0, z1 = z[:, :half], z[:, half:]
        shift = self.post(self.enc(self.pre(z0) * mask, mask, g)) * mask
        return torch.cat([z0, (z1 - shift) * mask], dim=1)


class ResidualCouplingFlow(nn.Module):
    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        self.couplings = nn.ModuleList(ResidualCouplingLayer(hp) for _ in range(hp.flow_layers))

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """Prior sample (B, C, T_frames) -> decoder latent; each coupling follows a channel flip."""
        for coupling in reversed(self.couplings):
            z = coupling.reverse(torch.flip(z, [1]), mask, g)
        return z


# ---------------------------------------------------------------- HiFi-GAN generator


def _same_padding(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock(nn.Module):
    """HiFi-GAN residual block. Type "1" has a dilated conv and a plain conv per dilation."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...], block_type: str):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_same_padding(kernel_size, d))
            for d in dilations
        )
        self.convs2 = (
            nn.ModuleList(
                nn.Conv1d(channels, channels, kernel_size, padding=_same_padding(kernel_size, 1)) for _ in dilations
            )
            if block_type == "1"
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs1):
            y = conv(F.leaky_relu(x, LRELU_SLOPE))
            if self.convs2 is not None:
                y = self.convs2[i](F.leaky_relu(y, LRELU_SLOPE))
            x = x + y
        return x


class HifiGanGenerator(nn.Module):
    """Latent frames (B, C_lat, T_frames) -> waveform (B, 1, T_frames * hop)."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        ch = hp.upsample_initial_channel
        self.num_kernels = len(hp.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(hp.latent_channels, ch, 7, padding=3)
        self.cond = nn.Conv1d(hp.speaker_channels, ch, 1) if hp.num_speakers > 1 else None
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(hp.upsample_rates, hp.upsample_kernel_sizes)):
            out_ch = ch // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(out_ch * 2, out_ch, kernel, rate, padding=(kernel - rate) // 2))
            for k, dilations in zip(hp.resblock_kernel_sizes, hp.resblock_dilations):
                self.resblocks.append(ResBlock(out_ch, k, dilations, hp.resblock_type))
        self.conv_post = nn.Conv1d(out_ch, 1, 7, padding=3, bias=False)

    def forward(self, z: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        x = self.conv_pre(z)
        if g is not None and self.cond is not None:
            x = x + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = sum(block(x) for block in blocks) / self.num_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


# ---------------------------------------------------------------- the whole synthesizer


def durations_to_alignment(durations: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """Hard monotonic alignment from integer durations, without data-dependent scatter.

    durations: (B, T_text) frames per phoneme; frame_mask: (B, T_frames).
    Returns (B, T_text, T_frames) with 1 where frame f belongs to phoneme p.
    """
    ends = torch.cumsum(durations, dim=1)  # (B, T_text)
    starts = ends - durations
    frames = torch.arange(frame_mask.shape[1], device=durations.device, dtype=durations.dtype)
    frames = frames.view(1, 1, -1)  # (1, 1, T_frames)
    inside = (frames >= starts.unsqueeze(-1)) & (frames < ends.unsqueeze(-1))
    return inside.to(frame_mask.dtype) * frame_mask.unsqueeze(1)


class DecoderLatent(NamedTuple):
    """The decoder's input for a batch: the flow output and the frames that are real."""

    z: torch.Tensor  # (B, C_lat, T_frames), zero past each item's frame length
    frame_lengths: torch.Tensor  # (B,) int64
    durations: torch.Tensor  # (B, T_text) int64 frames per phoneme
    speaker_embedding: torch.Tensor | None  # (B, C_g, 1) for multi-speaker voices


class PiperVits(nn.Module):
    """Piper's VITS synthesizer, inference only. Parameter names match Piper checkpoints."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__()
        self.hp = hp
        self.enc_p = TextEncoder(hp)
        self.dp = StochasticDurationPredictor(hp)
        self.flow = ResidualCouplingFlow(hp)
        self.dec = HifiGanGenerator(hp)
        self.emb_g = nn.Embedding(hp.num_speakers, hp.speaker_channels) if hp.num_speakers > 1 else None

    # Roles of the replaceable parts (models/interface.py) -> attribute names, which follow Piper checkpoints.
    PART_ATTRIBUTES = {"encoder": "enc_p", "duration": "dp", "flow": "flow", "decoder": "dec"}

    def parts(self) -> dict[str, nn.Module]:
        return {role: getattr(self, attr) for role, attr in self.PART_ATTRIBUTES.items()}

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Swap one part for a module with the same call signature (``reverse`` for the flow).

        Parts may compute in different dtypes as long as they take and return float32 at their
        edges (models/precision.py's PrecisionIsland): ``forward`` runs float32 between parts.
        """
        if role not in self.PART_ATTRIBUTES:
            raise ValueError(f"unknown part {role!r}; parts: {sorted(self.PART_ATTRIBUTES)}")
        setattr(self, self.PART_ATTRIBUTES[role], module)

    def predict_durations(
        self,
        hidden: torch.Tensor,
        text_mask: torch.Tensor,
        duration_noise: torch.Tensor,
        length_scale: float,
        g: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Integer frames per phoneme (B, T_text); ``duration_noise`` (B, 2, T_text) is pre-scaled."""
        log_durations = self.dp(hidden, text_mask, duration_noise, g)  # (B, 1, T_text)
        widths = torch.exp(log_durations) * text_mask * length_scale
        return torch.ceil(widths)[:, 0]

    def infer_latent(
        self,
        phoneme_ids: torch.Tensor,
        phoneme_lengths: torch.Tensor,
        duration_noise: torch.Tensor,
        prior_noise: torch.Tensor,
        noise_scale: float = 0.667,
        length_scale: float = 1.0,
        noise_scale_w: float = 0.8,
        speaker_id: torch.Tensor | None = None,
    ) -> DecoderLatent:
        """Everything up to the decoder: text -> durations -> prior sample -> flow output.

        duration_noise: (B, 2, T_text) and prior_noise: (B, C_lat, >= T_frames), standard normal.
        The decoder-training stages use this to get the teacher's decoder input.
        """
        hidden, prior_mean, prior_log_std, text_mask = self.enc_p(phoneme_ids, phoneme_lengths)
        g = self.emb_g(speaker_id).unsqueeze(-1) if self.emb_g is not None else None  # (B, C_g, 1)
        durations = self.predict_durations(hidden, text_mask, duration_noise * noise_scale_w, length_scale, g)
        frame_lengths = durations.sum(dim=1).clamp_min(1).long()  # (B,)
        # A data-dependent length: eager gets a Python int; torch.export gets an unbacked symbol
        # whose bounds the checks below state, so the exported graph keeps T_frames dynamic.
        max_frames = frame_lengths.max().item()
        if not torch.compiler.is_compiling() and prior_noise.shape[-1] < max_frames:
            raise ValueError(
                f"prior_noise covers {prior_noise.shape[-1]} frames but the utterance needs {max_frames}: "
                "raise VitsSampling.max_frames_per_phoneme_id"
            )
        torch._check(max_frames >= 1)
        torch._check(max_frames <= prior_noise.shape[-1])
        frame_mask = sequence_mask(frame_lengths, max_frames).to(hidden.dtype)  # (B, T_frames)
        alignment = durations_to_alignment(durations, frame_mask)  # (B, T_text, T_frames)
        frame_mean = prior_mean @ alignment  # (B, C_lat, T_frames)
        frame_log_std = prior_log_std @ alignment
        z_prior = frame_mean + prior_noise[:, :, :max_frames] * torch.exp(frame_log_std) * noise_scale
        z = self.flow.reverse(z_prior, frame_mask.unsqueeze(1), g)
        return DecoderLatent(z * frame_mask.unsqueeze(1), frame_lengths, durations.long(), g)

    def forward(
        self,
        phoneme_ids: torch.Tensor,
        phoneme_lengths: torch.Tensor,
        duration_noise: torch.Tensor,
        prior_noise: torch.Tensor,
        noise_scale: float = 0.667,
        length_scale: float = 1.0,
        noise_scale_w: float = 0.8,
        speaker_id: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Synthesize a padded batch; arguments as for ``infer_latent``.

        Returns audio (B, T_audio), audio_lengths (B,), durations (B, T_text).
        """
        latent = self.infer_latent(phoneme_ids, phoneme_lengths, duration_noise, prior_noise,
                                   noise_scale, length_scale, noise_scale_w, speaker_id)
        audio = self.dec(latent.z, latent.speaker_embedding)[:, 0]  # (B, T_audio)
        return audio, latent.frame_lengths * self.hp.hop_length, latent.durations


def hyperparams_from_dict(fields: dict) -> VitsHyperParams:
    known = {f.name for f in dataclasses.fields(VitsHyperParams)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"student config hyperparams: unknown keys {unknown}; accepted: {sorted(known)}")

    def as_tuples(value):  # JSON lists back to the tuples VitsHyperParams holds
        return tuple(as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value

    return VitsHyperParams(**{name: as_tuples(value) for name, value in fields.items()})
