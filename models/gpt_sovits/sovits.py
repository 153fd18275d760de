"""GPT-SoVITS v2's SoVITS synthesizer, inference path only: semantic codes + phonemes + a reference
spectrogram -> 32 kHz waveform.

    codes (B, 1, T_c) --quantizer.decode--> (B, 768, T_c) --x2 nearest--> enc_p (+ phonemes, MRTE with ge)
        -> prior (m_p, logs_p) (B, inter, 2 T_c) --z_p = m_p + noise * exp(logs_p) * noise_scale-->
        flow (reversed, conditioned on ge) -> dec (HiFi-GAN, conditioned on ge) -> audio (B, 1, 2 T_c * hop)
    ssl (B, 768, T) --ssl_proj (k=2, stride 2)--> quantizer.encode -> codes (1, B, T // 2)
    reference spectrogram (B, bins, T_ref) --ref_enc--> ge (B, gin, 1)

Submodule and parameter names are the official ``SynthesizerTrn``'s (``enc_p``, ``ref_enc``, ``flow``,
``dec``, ``ssl_proj``, ``quantizer.vq.layers.N._codebook.embed``), so an official state dict loads 1:1
once ``models.gpt_sovits.sovits_checkpoint`` has folded its weight norms. The posterior encoder
(``enc_q``) is training-only and absent.

Departures from the official code, exact at inference:
* noise is an input (a tensor, or ``noise_scale=0``), never drawn inside;
* relative-position attention reads its band of scores with gathers instead of pad-and-reshape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from models.layers import ChannelLayerNorm

LRELU_SLOPE = 0.1  # HiFi-GAN's slope inside the decoder; the last activation uses torch's default 0.01

# Sizes the official code fixes in its constructors rather than reading from the config.
ATTENTION_WINDOW = 4  # relative-position window of every self-attention encoder
MRTE_HIDDEN_CHANNELS = 512  # the MRTE's inner width; the reference embedding is added to it
MRTE_HEADS = 4
FLOW_KERNEL_SIZE = 5
FLOW_WAVENET_LAYERS = 4
FLOW_COUPLINGS = 4
REFERENCE_HIDDEN = 128  # MelStyleEncoder's width
REFERENCE_KERNEL_SIZE = 5
REFERENCE_HEADS = 2
SEMANTIC_UPSAMPLING = 2  # 25 Hz codes -> 50 Hz latent frames ("25hz" at inference, always)


@dataclass(frozen=True)
class SovitsConfig:
    """Sizes of a SoVITS v2 synthesizer. ``sovits_checkpoint.config_from_official`` builds one from
    a file's own config and tensor shapes."""

    phoneme_vocab_size: int  # 732 in v2 (322 in v1)
    reference_bins: int  # spectrogram bins the reference encoder reads: 704 in v2, all 1025 in v1
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    resblock: str = "1"  # "1": two convs per dilation; "2": one
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (10, 8, 2, 2, 2)
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8, 2, 2)
    gin_channels: int = 512
    ssl_dim: int = 768  # HuBERT-base feature width
    codebook_size: int = 1024
    n_codebooks: int = 1
    sample_rate_hz: int = 32000
    filter_length: int = 2048
    hop_length: int = 640
    win_length: int = 2048

    @property
    def spec_channels(self) -> int:
        return self.filter_length // 2 + 1


def sequence_mask(lengths: torch.Tensor, max_length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B,) lengths -> (B, 1, T) mask in ``dtype`` (the activations'), 1 on valid frames."""
    positions = torch.arange(max_length, device=lengths.device)  # (T,)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).to(dtype)


class ConvAttention(nn.Module):
    """Multi-head attention with 1x1-conv projections over (B, C, T) tensors. With ``window`` it is
    self-attention with relative-position key and value embeddings shared by all heads, zero outside
    +-window (VITS's encoder); without it, plain cross-attention (the MRTE)."""

    def __init__(self, channels: int, out_channels: int, n_heads: int, window: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.head_channels = channels // n_heads
        self.window = window
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        if window is not None:
            self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window + 1, self.head_channels))
            self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window + 1, self.head_channels))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, length = x.shape
        return x.view(batch, self.n_heads, self.head_channels, length).transpose(2, 3)  # (B, H, T, d)

    def _band(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """offset[i, j] = j - i + window, and whether it lies inside the window."""
        positions = torch.arange(length, device=device)
        offset = positions.unsqueeze(0) - positions.unsqueeze(1) + self.window  # (T, T)
        inside = (offset >= 0) & (offset <= 2 * self.window)
        return offset.clamp(0, 2 * self.window), inside

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, C, T_q), context (B, C, T_k), mask (B, 1, T_q, T_k) with 1 where attending is allowed."""
        query = self._heads(self.conv_q(x)) / math.sqrt(self.head_channels)  # (B, H, T_q, d)
        key = self._heads(self.conv_k(context))  # (B, H, T_k, d)
        value = self._heads(self.conv_v(context))  # (B, H, T_k, d)
        scores = query @ key.transpose(2, 3)  # (B, H, T_q, T_k)
        if self.window is not None:
            length = scores.shape[-1]
            offset, inside = self._band(length, x.device)
            relative = query @ self.emb_rel_k[0].transpose(0, 1)  # (B, H, T, 2w+1): score per offset
            band = torch.gather(relative, 3, offset.expand(*relative.shape[:2], length, length))  # (B, H, T, T)
            scores = scores + band * inside
        scores = scores.masked_fill(mask == 0, -1e4)
        weights = F.softmax(scores, dim=-1)  # (B, H, T_q, T_k)
        output = weights @ value  # (B, H, T_q, d)
        if self.window is not None:
            # The weight query i gives key i + r - window, per offset r, then the value embeddings.
            length = weights.shape[-1]
            positions = torch.arange(length, device=x.device)
            key_index = positions.unsqueeze(1) + torch.arange(2 * self.window + 1, device=x.device) - self.window
            valid = (key_index >= 0) & (key_index < length)  # (T, 2w+1)
            key_index = key_index.clamp(0, length - 1).expand(*weights.shape[:2], length, -1)
            per_offset = torch.gather(weights, 3, key_index) * valid  # (B, H, T, 2w+1)
            output = output + per_offset @ self.emb_rel_v[0]  # (B, H, T, d)
        batch, _, length_q, _ = output.shape
        output = output.transpose(2, 3).reshape(batch, self.n_heads * self.head_channels, length_q)  # (B, C, T_q)
        return self.conv_o(output)


class FeedForward(nn.Module):
    """Two 'same'-padded convs with a ReLU between, masked before each conv."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.padding = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.conv_1(F.pad(x * mask, self.padding)))  # (B, F, T)
        return self.conv_2(F.pad(hidden * mask, self.padding)) * mask  # (B, C, T)


class AttentionEncoder(nn.Module):
    """Post-norm transformer encoder (relative-position attention + conv feed-forward)."""

    def __init__(self, channels: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int):
        super().__init__()
        self.attn_layers = nn.ModuleList(
            ConvAttention(channels, channels, n_heads, window=ATTENTION_WINDOW) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FeedForward(channels, filter_channels, kernel_size) for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, C, T), mask (B, 1, T)."""
        pair_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)  # (B, 1, T, T)
        x = x * mask
        for attention, norm_1, feed_forward, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm_1(x + attention(x, x, pair_mask))
            x = norm_2(x + feed_forward(x, mask))
        return x * mask


class MultiReferenceTimbreEncoder(nn.Module):
    """MRTE: the SSL stream cross-attends to the phonemes, in a wider space where the reference
    embedding is added."""

    def __init__(self, content_channels: int, out_channels: int):
        super().__init__()
        self.cross_attention = ConvAttention(MRTE_HIDDEN_CHANNELS, MRTE_HIDDEN_CHANNELS, MRTE_HEADS)
        self.c_pre = nn.Conv1d(content_channels, MRTE_HIDDEN_CHANNELS, 1)
        self.text_pre = nn.Conv1d(content_channels, MRTE_HIDDEN_CHANNELS, 1)
        self.c_post = nn.Conv1d(MRTE_HIDDEN_CHANNELS, out_channels, 1)

    def forward(
        self, ssl: torch.Tensor, ssl_mask: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor, ge: torch.Tensor
    ) -> torch.Tensor:
        """ssl (B, C, T_y), text (B, C, T_x), masks (B, 1, T), ge (B, 512, 1) -> (B, C_out, T_y)."""
        cross_mask = text_mask.unsqueeze(2) * ssl_mask.unsqueeze(-1)  # (B, 1, T_y, T_x)
        ssl_hidden = self.c_pre(ssl * ssl_mask)  # (B, 512, T_y)
        text_hidden = self.text_pre(text * text_mask)  # (B, 512, T_x)
        attended = self.cross_attention(ssl_hidden * ssl_mask, text_hidden * text_mask, cross_mask)
        return self.c_post((attended + ssl_hidden + ge) * ssl_mask)


class TextEncoder(nn.Module):
    """``enc_p``: quantized SSL latents and phonemes -> the prior's mean and log-scale."""

    def __init__(self, config: SovitsConfig):
        super().__init__()
        hidden, filters, heads, layers = (
            config.hidden_channels, config.filter_channels, config.n_heads, config.n_layers
        )
        self.out_channels = config.inter_channels
        self.ssl_proj = nn.Conv1d(config.ssl_dim, hidden, 1)
        self.encoder_ssl = AttentionEncoder(hidden, filters, heads, layers // 2, config.kernel_size)
        self.encoder_text = AttentionEncoder(hidden, filters, heads, layers, config.kernel_size)
        self.text_embedding = nn.Embedding(config.phoneme_vocab_size, hidden)
        self.mrte = MultiReferenceTimbreEncoder(hidden, hidden)
        self.encoder2 = AttentionEncoder(hidden, filters, heads, layers // 2, config.kernel_size)
        self.proj = nn.Conv1d(hidden, config.inter_channels * 2, 1)

    def forward(
        self,
        latents: torch.Tensor,
        latent_mask: torch.Tensor,
        phoneme_ids: torch.Tensor,
        phoneme_mask: torch.Tensor,
        ge: torch.Tensor,
        speed: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """latents (B, 768, T_y), phoneme_ids (B, T_x), masks (B, 1, T) -> m_p, logs_p (B, inter, T'),
        mask (B, 1, T'); T' = int(T_y / speed) + 1 when speed != 1, else T_y."""
        y = self.ssl_proj(latents * latent_mask) * latent_mask  # (B, H, T_y)
        y = self.encoder_ssl(y * latent_mask, latent_mask)
        text = self.text_embedding(phoneme_ids).transpose(1, 2)  # (B, H, T_x)
        text = self.encoder_text(text * phoneme_mask, phoneme_mask)
        y = self.mrte(y, latent_mask, text, phoneme_mask, ge)
        y = self.encoder2(y * latent_mask, latent_mask)  # (B, H, T_y)
        mask = latent_mask
        if speed != 1:
            # Speed changes the frame count here, before the prior: linear for features, nearest for the mask.
            y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
            mask = F.interpolate(latent_mask, size=y.shape[-1], mode="nearest")
        stats = self.proj(y) * mask  # (B, 2 inter, T')
        m_p, logs_p = torch.split(stats, self.out_channels, dim=1)
        return m_p, logs_p, mask


class WaveNet(nn.Module):
    """Gated dilated convs with a global condition; weight-normed in official files (folded on load)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.channels = channels
        self.in_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in range(n_layers)
        )
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels if i < n_layers - 1 else channels, 1) for i in range(n_layers)
        )
        self.cond_layer = nn.Conv1d(gin_channels, 2 * channels * n_layers, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """x (B, C, T), mask (B, 1, T), g (B, gin, 1)."""
        output = torch.zeros_like(x)
        condition = self.cond_layer(g)  # (B, 2 C L, 1)
        last = len(self.in_layers) - 1
        for i, (in_layer, res_skip_layer) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            gates = in_layer(x) + condition[:, i * 2 * self.channels : (i + 1) * 2 * self.channels]  # (B, 2C, T)
            acts = torch.tanh(gates[:, : self.channels]) * torch.sigmoid(gates[:, self.channels :])
            res_skip = res_skip_layer(acts)
            if i < last:
                x = (x + res_skip[:, : self.channels]) * mask
                output = output + res_skip[:, self.channels :]
            else:
                output = output + res_skip
        return output * mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half shifts by a function of the first."""

    def __init__(self, channels: int, hidden_channels: int, gin_channels: int):
        super().__init__()
        self.half_channels = channels // 2
        self.pre = nn.Conv1d(self.half_channels, hidden_channels, 1)
        self.enc = WaveNet(hidden_channels, FLOW_KERNEL_SIZE, FLOW_WAVENET_LAYERS, gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half_channels, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half_channels] * 2, dim=1)
        hidden = self.enc(self.pre(x0) * mask, mask, g)  # (B, H, T)
        shift = self.post(hidden) * mask  # (B, C/2, T)
        return torch.cat([x0, (x1 - shift) * mask], dim=1)


class ChannelFlip(nn.Module):
    """Reverses the channel order; a parameter-free slot in ``flow.flows`` (odd indices)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, [1])


class ResidualCouplingFlow(nn.Module):
    """``flow``: coupling layers at even indices, flips at odd ones (the official layout)."""

    def __init__(self, channels: int, hidden_channels: int, gin_channels: int):
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(FLOW_COUPLINGS):
            self.flows.append(ResidualCouplingLayer(channels, hidden_channels, gin_channels))
            self.flows.append(ChannelFlip())

    def reverse(self, z_p: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Prior sample (B, C, T) -> decoder latent (B, C, T)."""
        z = z_p
        for flow in reversed(self.flows):
            z = flow(z) if isinstance(flow, ChannelFlip) else flow.reverse(z, mask, g)
        return z


def _dilated_padding(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    """Per dilation: leaky-ReLU, dilated conv, leaky-ReLU, conv, residual add."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_dilated_padding(kernel_size, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=_dilated_padding(kernel_size, 1)) for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2 in zip(self.convs1, self.convs2):
            x = x + conv2(F.leaky_relu(conv1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class ResBlock2(nn.Module):
    """Per dilation: leaky-ReLU, dilated conv, residual add."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_dilated_padding(kernel_size, d))
            for d in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """``dec``: HiFi-GAN generator conditioned on the reference embedding, latent frames -> samples."""

    def __init__(self, config: SovitsConfig):
        super().__init__()
        initial = config.upsample_initial_channel
        self.conv_pre = nn.Conv1d(config.inter_channels, initial, 7, padding=3)
        self.cond = nn.Conv1d(config.gin_channels, initial, 1)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(initial // 2**i, initial // 2 ** (i + 1), kernel, rate, padding=(kernel - rate) // 2)
            for i, (rate, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes))
        )
        block = ResBlock1 if config.resblock == "1" else ResBlock2
        self.kernels_per_scale = len(config.resblock_kernel_sizes)
        self.resblocks = nn.ModuleList(
            block(initial // 2 ** (i + 1), kernel, tuple(dilations))
            for i in range(len(self.ups))
            for kernel, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.conv_post = nn.Conv1d(initial // 2 ** len(self.ups), 1, 7, padding=3, bias=False)

    def forward(self, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """z (B, inter, T), g (B, gin, 1) -> audio (B, 1, T * prod(upsample_rates)) in [-1, 1]."""
        x = self.conv_pre(z) + self.cond(g)  # (B, C0, T)
        for i, upsample in enumerate(self.ups):
            x = upsample(F.leaky_relu(x, LRELU_SLOPE))  # (B, C_i, T * r_1..r_i)
            blocks = self.resblocks[i * self.kernels_per_scale : (i + 1) * self.kernels_per_scale]
            x = sum(block(x) for block in blocks) / self.kernels_per_scale
        return torch.tanh(self.conv_post(F.leaky_relu(x)))  # (B, 1, T_wav)


class _Linear(nn.Module):
    """A Linear one level down (``<name>.fc``), as the official reference encoder nests it."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _GatedConv(nn.Module):
    """Conv + GLU with a residual add (``<name>.conv1.conv``)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv1 = nn.Module()
        self.conv1.conv = nn.Conv1d(channels, 2 * channels, kernel_size, padding=(kernel_size - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.glu(self.conv1.conv(x), dim=1)


class _StyleSelfAttention(nn.Module):
    """The reference encoder's attention: linear q/k/v, scores scaled by sqrt(model width) (not
    the head width, as the official code does), residual add."""

    def __init__(self, channels: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.w_qs = nn.Linear(channels, channels)
        self.w_ks = nn.Linear(channels, channels)
        self.w_vs = nn.Linear(channels, channels)
        self.fc = nn.Linear(channels, channels)
        self.temperature = math.sqrt(channels)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, -1).transpose(1, 2)  # (B, H, T, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape  # (B, T, C)
        query, key, value = self._heads(self.w_qs(x)), self._heads(self.w_ks(x)), self._heads(self.w_vs(x))
        weights = F.softmax(query @ key.transpose(2, 3) / self.temperature, dim=-1)  # (B, H, T, T)
        attended = (weights @ value).transpose(1, 2).reshape(batch, length, channels)  # (B, T, C)
        return self.fc(attended) + x


class ReferenceEncoder(nn.Module):
    """``ref_enc`` (MelStyleEncoder): a reference's linear spectrogram -> one style vector ``ge``.
    Reads every frame of its input: one unpadded reference per call, as the official decode does."""

    def __init__(self, in_bins: int, out_channels: int):
        super().__init__()
        self.in_bins = in_bins
        self.spectral = nn.Sequential(  # indices 2 and 5 are the official dropouts
            _Linear(in_bins, REFERENCE_HIDDEN), nn.Mish(), nn.Identity(),
            _Linear(REFERENCE_HIDDEN, REFERENCE_HIDDEN), nn.Mish(), nn.Identity(),
        )
        self.temporal = nn.Sequential(
            _GatedConv(REFERENCE_HIDDEN, REFERENCE_KERNEL_SIZE), _GatedConv(REFERENCE_HIDDEN, REFERENCE_KERNEL_SIZE)
        )
        self.slf_attn = _StyleSelfAttention(REFERENCE_HIDDEN, REFERENCE_HEADS)
        self.fc = _Linear(REFERENCE_HIDDEN, out_channels)

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        """spectrogram (B, >= in_bins, T) -> ge (B, out, 1); only the first ``in_bins`` bins are read."""
        x = self.spectral(spectrogram[:, : self.in_bins].transpose(1, 2))  # (B, T, 128)
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)  # (B, T, 128)
        x = self.fc(self.slf_attn(x))  # (B, T, out)
        return x.mean(dim=1).unsqueeze(-1)  # (B, out, 1)


class _Codebook(nn.Module):
    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self.register_buffer("embed", torch.zeros(codebook_size, dim))  # (K, D)


class _CodebookLayer(nn.Module):
    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(codebook_size, dim)


class ResidualVectorQuantizer(nn.Module):
    """``quantizer``: residual VQ over SSL latents (one 1024-entry codebook in v2). Encoding picks the
    nearest ``embed`` row by squared Euclidean distance, stage after stage on the residual."""

    def __init__(self, dim: int, codebook_size: int, n_codebooks: int):
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(_CodebookLayer(codebook_size, dim) for _ in range(n_codebooks))

    def codebooks(self) -> torch.Tensor:
        """(S, K, D): every stage's codebook, the layout ``export.rewrites.rvq`` takes."""
        return torch.stack([layer._codebook.embed for layer in self.vq.layers])

    def encode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents (B, D, T) -> codes (S, B, T) int64."""
        residual = latents.transpose(1, 2)  # (B, T, D)
        codes = []
        for layer in self.vq.layers:
            embed = layer._codebook.embed  # (K, D)
            # The official expression, term for term, so near-ties break the same way.
            distance = -(
                residual.pow(2).sum(-1, keepdim=True) - 2 * residual @ embed.t() + embed.pow(2).sum(-1)
            )  # (B, T, K)
            index = distance.argmax(dim=-1)  # (B, T)
            residual = residual - F.embedding(index, embed)
            codes.append(index)
        return torch.stack(codes)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (S, B, T), dimension 0 the stage -> latents (B, D, T), the chosen rows summed."""
        quantized = 0
        for stage, indices in enumerate(codes):
            quantized = quantized + F.embedding(indices, self.vq.layers[stage]._codebook.embed)  # (B, T, D)
        return quantized.transpose(1, 2)


class SovitsSynthesizer(nn.Module):
    """The v2 ``SynthesizerTrn`` without ``enc_q``."""

    def __init__(self, config: SovitsConfig):
        super().__init__()
        self.config = config
        self.enc_p = TextEncoder(config)
        self.dec = Generator(config)
        self.flow = ResidualCouplingFlow(config.inter_channels, config.hidden_channels, config.gin_channels)
        self.ref_enc = ReferenceEncoder(config.reference_bins, config.gin_channels)
        self.ssl_proj = nn.Conv1d(config.ssl_dim, config.ssl_dim, SEMANTIC_UPSAMPLING, stride=SEMANTIC_UPSAMPLING)
        self.quantizer = ResidualVectorQuantizer(config.ssl_dim, config.codebook_size, config.n_codebooks)

    @property
    def samples_per_code(self) -> int:
        return SEMANTIC_UPSAMPLING * math.prod(self.config.upsample_rates)

    def extract_latent(self, ssl_features: torch.Tensor) -> torch.Tensor:
        """HuBERT features (B, 768, T) at 50 Hz -> semantic codes (B, S, T // 2) at 25 Hz."""
        return self.quantizer.encode(self.ssl_proj(ssl_features)).transpose(0, 1)

    def reference_embedding(self, reference_spectrograms: list[torch.Tensor]) -> torch.Tensor:
        """Linear spectrograms, each (B, bins, T_ref) -> ge (B, gin, 1), the mean over references."""
        if not reference_spectrograms:
            raise ValueError("reference_spectrograms is empty: SoVITS v2 needs at least one reference clip")
        embeddings = [self.ref_enc(spectrogram) for spectrogram in reference_spectrograms]
        return torch.stack(embeddings).mean(0)

    def prior(
        self, codes: torch.Tensor, phoneme_ids: torch.Tensor, ge: torch.Tensor, speed: float = 1.0,
        code_lengths: torch.Tensor | None = None, phoneme_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """codes (B, S, T_c) (S = 1: the layouts (B, S, T) and (S, B, T) coincide for B = 1),
        phoneme_ids (B, T_x) -> m_p, logs_p (B, inter, T'), mask (B, 1, T'). Lengths default to full."""
        batch, _, n_codes = codes.shape
        if code_lengths is None:
            code_lengths = torch.full((batch,), n_codes, device=codes.device)
        if phoneme_lengths is None:
            phoneme_lengths = torch.full((batch,), phoneme_ids.shape[1], device=codes.device)
        latents = self.quantizer.decode(codes.transpose(0, 1))  # (B, D, T_c)
        latents = F.interpolate(latents, scale_factor=SEMANTIC_UPSAMPLING, mode="nearest")  # (B, D, 2 T_c)
        latent_mask = sequence_mask(code_lengths * SEMANTIC_UPSAMPLING, latents.shape[-1], latents.dtype)
        phoneme_mask = sequence_mask(phoneme_lengths, phoneme_ids.shape[1], latents.dtype)
        return self.enc_p(latents, latent_mask, phoneme_ids, phoneme_mask, ge, speed)

    def synthesize_latent(
        self, m_p: torch.Tensor, logs_p: torch.Tensor, mask: torch.Tensor, ge: torch.Tensor,
        noise: torch.Tensor | None = None, noise_scale: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior -> (z (B, inter, T'), audio (B, 1, T' * hop)). ``noise`` is a standard-normal tensor
        shaped like ``m_p``; it is required when ``noise_scale`` is not 0."""
        z_p = m_p
        if noise_scale != 0:
            if noise is None or noise.shape != m_p.shape:
                got = "None" if noise is None else tuple(noise.shape)
                raise ValueError(f"noise_scale={noise_scale} needs a noise tensor shaped {tuple(m_p.shape)}, got {got}")
            z_p = m_p + noise * torch.exp(logs_p) * noise_scale
        z = self.flow.reverse(z_p, mask, ge)
        return z, self.dec(z * mask, ge)

    def decode(
        self, codes: torch.Tensor, phoneme_ids: torch.Tensor, reference_spectrograms: list[torch.Tensor],
        noise: torch.Tensor | None = None, noise_scale: float = 0.0, speed: float = 1.0,
    ) -> torch.Tensor:
        """The official ``decode``: codes (B, 1, T_c), target phoneme_ids (B, T_x), reference
        spectrograms [(B, bins, T_ref), ...] -> audio (B, 1, samples) at ``config.sample_rate_hz``."""
        ge = self.reference_embedding(reference_spectrograms)
        m_p, logs_p, mask = self.prior(codes, phoneme_ids, ge, speed)
        return self.synthesize_latent(m_p, logs_p, mask, ge, noise, noise_scale)[1]
